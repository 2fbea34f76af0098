"""Inference replicas that start paused or restart mid-run (fake engines over real HTTP, real
verifiers rollouts): none generates before it serves the current policy, and a rollout that
was in flight on a replica that died comes back marked as lost with its replica (the
orchestrator re-issues it, tests/orchestrator/test_lost_replicas.py), never trained."""

import asyncio
import contextlib
import socket
import time

import pytest
from rlkube.config import ClientConfig, EnvConfig, SamplingConfig
from rlkube.config.inference import POLICY_ADAPTER
from rlkube.envs import load_env
from rlkube.inference.client import InferenceError
from rlkube.orchestrator.inference import InferencePool, accepts_connections
from rlkube.orchestrator.rollouts import EnvRunner, lost_its_replica, replica_lost, run_group

from tests.fixtures.inference import free_port
from tests.fixtures.network import VanishingPeerProxy
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

SAMPLING = SamplingConfig(max_tokens=8)


@contextlib.contextmanager
def replicas(tiny_model, n, start_paused=True):
    from transformers import AutoTokenizer

    stop = AutoTokenizer.from_pretrained(tiny_model).convert_tokens_to_ids("<|im_end|>")
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(FakeInferenceThread(FakeInference(str(tiny_model), stop))) for _ in range(n)]
        if start_paused:
            for server in servers:
                server.call(server.fake.restart)
        yield servers


def make_pool(tiny_model, urls, **client):
    config = ClientConfig(**{"base_urls": urls, "resync_interval_s": 0.1} | client)
    return InferencePool(config, str(tiny_model), str(tiny_model), SAMPLING)


async def rollout_on(pool, runner, replica: int, policy=lambda: 1):
    """One rollout of a task routed to `replica`."""
    while True:
        example_id, task = runner.next_task()
        url = pool.replica_for(runner.name, example_id)
        if url == pool.base_urls[replica]:
            return await runner.rollout(task, example_id, pool.context_at(url), SAMPLING.temperature, policy)


async def until(predicate):
    while not predicate():
        await asyncio.sleep(0.05)


def test_a_restarted_replica_is_brought_to_the_policy_before_it_generates(tiny_model):
    env_config = EnvConfig(args={"num_examples": 20})
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    with replicas(tiny_model, 2) as servers:
        fakes = [s.fake for s in servers]

        async def go():
            pool = make_pool(tiny_model, [s.url for s in servers])
            async with runner.serving():
                # Both started paused at "default": the start sync tags the base model as 0.
                assert sorted(await pool.sync((0, None), 60, fresh=True)) == sorted(pool.base_urls)
                assert [f.weight_version for f in fakes] == ["0", "0"]
                await pool.load_policy(1, "/w/step_1", 60)
                watcher = asyncio.ensure_future(pool.watch(lambda: (1, "/w/step_1"), 60))
                try:
                    assert (await rollout_on(pool, runner, 1)).error is None
                    servers[1].call(fakes[1].restart)  # replica 1 restarts on the base weights
                    await until(lambda: fakes[1].weight_version == "default")
                    rollout = await rollout_on(pool, runner, 1)  # waits while it is paused
                    assert rollout.error is None and rollout.served_versions == ["1"]
                    await until(lambda: fakes[1].weight_version == "1")
                finally:
                    watcher.cancel()
            return rollout

        asyncio.run(go())
        assert fakes[1].generated_versions and set(fakes[1].generated_versions) == {"1"}, "nothing on base weights"
        loads = [body["kwargs"]["location"] for route, body in fakes[1].calls if route == "collective_rpc"]
        assert loads == ["/w/step_1", "/w/step_1"], "loaded by the policy update, then again after the restart"
        assert [r for r, _ in fakes[0].calls].count("pause") == 2, "the healthy replica was left alone"


@pytest.mark.parametrize("path", ["lean", "verifiers"])
def test_a_rollout_in_flight_on_a_replica_that_dies_comes_back_lost_and_the_replica_down(tiny_model, path):
    env_config = EnvConfig(args={"num_examples": 20}, rollout_path=path)
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    with replicas(tiny_model, 2, start_paused=False) as servers:
        servers[1].fake.hang = True  # the request hangs in the engine

        async def go():
            pool = make_pool(tiny_model, [s.url for s in servers], resync_interval_s=60)
            async with runner.serving():
                await rollout_on(pool, runner, 0)  # renderers resolve the context length once
                example_id, task = next((e, t) for e, t in (runner.next_task() for _ in range(20))
                                        if pool.replica_for(runner.name, e) == servers[1].url)
                group = asyncio.ensure_future(run_group(runner, pool, example_id, task, 2, 1.0, lambda: 1))
                await until(lambda: servers[1].fake.generate_requests == 2 or group.done())
                await asyncio.to_thread(servers[1].__exit__)  # the replica dies
                return await group, pool.replica_for(runner.name, example_id)

        group, rerouted = asyncio.run(go())
    assert all(replica_lost(r) and not r.trainable for r in group), [r.error for r in group]
    assert rerouted == servers[0].url, "the task's next rollouts go to the healthy replica"


def test_a_replica_is_lost_only_when_it_accepts_no_connection():
    """Its rollouts are abandoned only then: an engine too busy to answer `/weight_info` within
    the read timeout (on 2 cores, 128 rollouts in flight) still accepts connections."""
    with socket.create_server(("127.0.0.1", 0)) as busy:  # listens, never answers
        url = f"http://127.0.0.1:{busy.getsockname()[1]}"
        assert asyncio.run(accepts_connections(url))
    assert not asyncio.run(accepts_connections(url)), "nothing listens"
    assert not asyncio.run(accepts_connections("http://no-such-replica.invalid:8000")), "the name is gone"


def test_only_a_replica_that_is_gone_or_restarting_loses_a_rollout():
    for error in ("ProviderError: engine unreachable: Cannot connect to host x:8000 [Name or service not known]",
                  "ProviderError: Connection error.", "ProviderError: HTTP 503: starting",
                  "ProviderError: Error code: 502 - bad gateway", "ProviderError: ClientPayloadError: cut off"):
        assert lost_its_replica(error, marked_down=False), error
    for timeout in ("ProviderError: engine timed out: ", "ProviderError: Request timed out."):
        assert lost_its_replica(timeout, marked_down=True) and not lost_its_replica(timeout, marked_down=False)
    for error in (None, "ProviderError: HTTP 500: engine bug", "ProviderError: HTTP 400: prompt too long",
                  "ValueError: engine unreachable", "ToolError: Connection error."):
        assert not lost_its_replica(error, marked_down=True), error


def test_replicas_of_an_earlier_run_unreachable_ones_and_nccl(tiny_model):
    with replicas(tiny_model, 1, start_paused=False) as (server,):
        server.call(setattr, server.fake, "weight_version", "3")
        pool = make_pool(tiny_model, [server.url, f"http://127.0.0.1:{free_port()}"])
        # A fresh run whose replica still serves policy 3 of an earlier attempt reloads the model.
        assert asyncio.run(pool.sync((0, None), 60, fresh=True)) == [server.url]
        rpcs = [body for route, body in server.fake.calls if route == "collective_rpc"]
        assert rpcs == [{"method": "reload_weights", "kwargs": {"weights_path": str(tiny_model)}, "timeout": 60}]
        assert server.fake.weight_version == "0"
        server.call(setattr, server.fake, "weight_version", "3")
        # Mid-run, the unreachable replica is skipped (its rollouts fail by themselves).
        assert asyncio.run(pool.sync((3, "/w/step_3"), 60)) == []
        # Over NCCL the trainer pauses the replicas around its broadcasts: a paused replica at
        # the policy (or past it) is left alone, a restarted one cannot be given the policy.
        nccl = InferencePool(pool.config, str(tiny_model), str(tiny_model), SAMPLING, trainer_sends_weights=True)
        server.call(server.fake.resumed.clear)
        assert asyncio.run(nccl.sync((3, "nccl://trainer:29600"), 60)) == []
        assert asyncio.run(pool.sync((3, "/w/step_3"), 60)) == [server.url], "paused while the pool drives it"
        server.call(server.fake.restart)
        with pytest.raises(RuntimeError, match="weights.type = 'nccl'"):
            asyncio.run(nccl.sync((3, "nccl://trainer:29600"), 60))


def test_a_policy_update_passes_a_replica_that_is_down_and_fails_on_one_that_refuses(tiny_model):
    with replicas(tiny_model, 1, start_paused=False) as (server,):
        pool = make_pool(tiny_model, [server.url, f"http://127.0.0.1:{free_port()}"])
        # The down replica is left to `sync` (it gets the newest loaded policy when it is back).
        asyncio.run(pool.load_policy(2, "/w/step_2", 60))
        assert server.fake.weight_version == "2" and pool.loaded == (2, "/w/step_2")
        server.call(server.fake.unloadable.add, "/w/step_3")
        with pytest.raises(InferenceError, match="cannot load /w/step_3"):
            asyncio.run(pool.load_policy(3, "/w/step_3", 60))
        assert pool.loaded == (2, "/w/step_2")
        assert server.fake.resumed.is_set(), "a failed load still resumes generation"


@pytest.mark.parametrize("update", ["load_policy", "sync"])
def test_a_replica_that_vanishes_during_a_weight_update_is_lost_at_once(tiny_model, update):
    """Replica 1 vanishes (its open connections go silent, new ones are refused) while its
    `/pause` is in flight, in a policy update or in the `sync` of replicas that (re)started:
    replica 0 gets the policy and the update ends, with replica 1 marked down, long before the
    pause's 60 s timeout would have ended it."""
    with replicas(tiny_model, 2, start_paused=False) as servers:
        proxy = VanishingPeerProxy(servers[1].port)
        silent_url = f"http://127.0.0.1:{proxy.port}"
        servers[1].call(servers[1].fake.silent_routes.add, "pause")
        pool = make_pool(tiny_model, [servers[0].url, silent_url])

        async def go():
            started = time.monotonic()
            task = asyncio.ensure_future(
                pool.load_policy(2, "/w/step_2", 60) if update == "load_policy" else pool.sync((2, "/w/step_2"), 60)
            )
            await until(lambda: any(route == "pause" for route, _ in servers[1].fake.calls))
            proxy.vanish_and_point_to(free_port())
            proxy.listener.close()
            return await asyncio.wait_for(task, 20), started

        try:
            result, started = asyncio.run(go())
        finally:
            proxy.close()
    assert servers[0].fake.weight_version == "2"
    assert pool.down_since(silent_url, started), "the vanished replica is marked down"
    if update == "sync":
        assert result == [servers[0].url]
    else:
        assert pool.loaded == (2, "/w/step_2")


def test_a_lora_run_served_as_an_adapter_requests_it_from_the_first_policy_on(tiny_model):
    """`client.lora_adapter`: policies load through rlkube's adapter route (never the worker's
    merge), requests name the base model at policy 0 and the adapter after, and a replica that
    restarts (adapter gone) gets it again before it generates."""
    env_config = EnvConfig(args={"num_examples": 20})
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    with replicas(tiny_model, 2) as servers:
        fakes = [s.fake for s in servers]

        async def go():
            pool = make_pool(tiny_model, [s.url for s in servers], lora_adapter=POLICY_ADAPTER)
            async with runner.serving():
                await pool.sync((0, None), 60, fresh=True)
                assert (await rollout_on(pool, runner, 0, policy=lambda: 0)).error is None
                await pool.load_policy(1, "/w/step_1", 60)
                assert (await rollout_on(pool, runner, 0)).error is None
                watcher = asyncio.ensure_future(pool.watch(lambda: (1, "/w/step_1"), 60))
                try:
                    servers[1].call(fakes[1].restart)
                    await until(lambda: fakes[1].weight_version == "default")
                    rollout = await rollout_on(pool, runner, 1)  # waits while it is paused
                finally:
                    watcher.cancel()
            return rollout

        rollout = asyncio.run(go())
    assert rollout.error is None and rollout.served_versions == ["1"]
    assert fakes[0].requested_models == [str(tiny_model), POLICY_ADAPTER]
    assert fakes[1].requested_models == [POLICY_ADAPTER] and fakes[1].adapter == "/w/step_1"
    for fake, loads in zip(fakes, (1, 2)):
        assert [route for route, _ in fake.calls if route in ("collective_rpc", "rlkube/load_lora_adapter")] == (
            ["rlkube/load_lora_adapter"] * loads
        )
        adapter_loads = [body for route, body in fake.calls if route == "rlkube/load_lora_adapter"]
        assert all(body["location"] == "/w/step_1" and body["step"] == "1" for body in adapter_loads)
