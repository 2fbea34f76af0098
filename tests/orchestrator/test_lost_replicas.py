"""A lost inference replica never becomes a lost step: the whole orchestrator (real reverse_text
env, real verifiers rollouts, fake engines over real HTTP, the trainer's side over real gRPC)
while a replica dies mid-request, in-process and in an `rlkube env-worker` process. Rollouts cut
off with it are re-issued to the other replica, or wait for it to come back on the current
policy; no batch counts them as errors, none is short, and none is served while every replica
is down. And a batch with too few samples to train on waits for more groups."""

import asyncio
import contextlib

import pytest
from rlkube.orchestrator.app import build_runners
from rlkube.orchestrator.inference import pick_replica
from rlkube.orchestrator.orchestrator import Orchestrator
from rlkube.transport.client import RolloutClient
from rlkube.transport.server import start_server, stop_server

from tests.fixtures.inference import free_port
from tests.fixtures.network import VanishingPeerProxy
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread
from tests.orchestrator.test_env_workers import (
    eventually,
    pool_for,
    reverse_text_config,
    run_monitored,
    worker_processes,
)
from tests.orchestrator.test_orchestrator import FakePool, FakeRunner, make_config, run_with_trainer


def full_batches(logged: list[tuple[int, dict]], batch_size: int) -> list[dict]:
    """The logged batches, asserted full: every rollout trained, none errored."""
    batches = [m for _, m in logged if "rollouts" in m]
    for m in batches:
        assert m["errored_rollouts"] == 0 and m["rollouts"] == m["samples/trained"] == batch_size, m
    return batches


@pytest.mark.parametrize("env_workers", [0, 1], ids=["in-process", "env-worker"])
@pytest.mark.parametrize("death", ["killed", "vanished", "engine-dead"])
def test_rollouts_of_a_replica_that_dies_are_reissued_to_the_other(tiny_model, tmp_path, env_workers, death):
    """A replica dies with requests in flight: killed (its connections reset), vanished (a
    pod or node gone with its network: its connections go silent, nothing resets them, and
    only the pool's watch notices that it accepts no connection, long before
    `client.timeout_s`), or its engine dead (vLLM answers what it holds with a 500 as a SIGTERM
    stops it, and its health check fails, while the replica is still listed: a scale-down whose
    new list the pool has not read yet). One group at a time
    (`max_concurrent` = `group_size`), so a group stuck on the dead replica would stall the
    run. The replica that dies is the first task's, so it gets requests whatever ports the
    replicas got."""
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(FakeInferenceThread(FakeInference(str(tiny_model), 3))) for _ in range(2)]
        proxies = [VanishingPeerProxy(server.port) for server in servers]
        for proxy in proxies:
            stack.callback(proxy.close)
        urls = [f"http://127.0.0.1:{p.port}" for p in proxies] if death == "vanished" else [s.url for s in servers]
        config = reverse_text_config(
            tmp_path, tiny_model, urls[0], env_workers=env_workers,
            client={"base_urls": urls, "max_concurrent": 4, "resync_interval_s": 0.2},
        )
        # the replica that dies is the one the run's first task is routed to (by hashing its URL)
        runner = build_runners(config)[0]
        dying = urls.index(pick_replica(runner.name, runner.next_task()[0], urls))
        server, proxy = servers[dying], proxies[dying]
        server.fake.hang = True  # its requests hang until it dies
        logged: list[tuple[int, dict]] = []
        orchestrator = Orchestrator(config, build_runners(config), pool_for(config), lambda m, s: logged.append((s, m)))
        killed = []

        async def kill_it_mid_request():
            if not killed and server.fake.generate_requests:
                killed.append(server.fake.generate_requests)
                if death == "vanished":  # open connections go silent, new ones find nobody
                    proxy.vanish_and_point_to(free_port())
                    proxy.listener.close()
                elif death == "engine-dead":
                    server.call(server.fake.die)
                else:
                    await asyncio.to_thread(server.__exit__)

        with worker_processes(config, tmp_path) if env_workers else contextlib.nullcontext():
            results = asyncio.run(asyncio.wait_for(run_monitored(orchestrator, config, kill_it_mid_request), 300))
    assert sorted(results) == [1, 2, 3]
    assert killed, "the dying replica got requests before it died"
    batches = full_batches(logged, config.batch_size)
    assert sum(m["rollouts/reissued"] for m in batches) >= killed[0], "what was cut off ran again"


def test_a_single_replica_that_restarts_holds_the_next_batch_until_it_serves_the_policy(tiny_model, tmp_path):
    """The only replica dies while generating batch 2 (synchronous run: after policy 1): the
    trainer's request for batch 2 gets nothing while it is down. It comes back restarted
    (paused, base weights) and answers 503 at first; it is brought to policy 1, and batch 2 is
    whole, sampled by policy 1 only."""
    first = FakeInference(str(tiny_model), 3)
    with FakeInferenceThread(first) as server:
        config = reverse_text_config(tmp_path, tiny_model, server.url, env_workers=0, async_level=0)
        logged: list[tuple[int, dict]] = []
        orchestrator = Orchestrator(config, build_runners(config), pool_for(config), lambda m, s: logged.append((s, m)))
        restarted = FakeInference(str(tiny_model), 3)
        restarted.restart()
        restarted.unavailable = 4

        async def trainer(client: RolloutClient) -> None:
            call = asyncio.to_thread
            await call(client.get_batch, 1, 0, 1)
            first.hang = True  # batch 2's requests hang in the engine
            served = first.generate_requests
            await call(client.report_policy, 1, "/w/step_1")
            await eventually(lambda: first.generate_requests > served, 30, "batch 2's requests")
            await call(server.__exit__)  # the replica dies
            batch_2 = asyncio.ensure_future(call(client.get_batch, 2, 0, 1))
            await asyncio.sleep(3)
            assert not batch_2.done(), "no batch while every replica is down"
            with FakeInferenceThread(restarted, port=server.port):
                await asyncio.wait_for(batch_2, 60)
                await call(client.report_policy, 2, "/w/step_2")
                await call(client.get_batch, 3, 0, 1)
                await call(client.report_policy, 3, "/w/step_3")

        async def go():
            grpc_server = await start_server(orchestrator, "127.0.0.1", config.rollouts.port)
            run = asyncio.ensure_future(orchestrator.run())
            try:
                with RolloutClient(f"127.0.0.1:{config.rollouts.port}", timeout_s=120) as client:
                    await asyncio.wait_for(trainer(client), 120)
                await asyncio.wait_for(run, 30)
            finally:
                run.cancel()
                await stop_server(grpc_server, 1)

        asyncio.run(go())
    batches = full_batches(logged, config.batch_size)
    assert [s for s, m in logged if "rollouts" in m] == [1, 2, 3]
    assert batches[1]["rollouts/reissued"] >= 1
    assert restarted.unavailable == 0 and set(restarted.generated_versions) <= {"1", "2"}, restarted.generated_versions
    assert restarted.generated_versions[0] == "1", "brought to policy 1 before it generated"


def test_a_batch_with_too_few_samples_takes_more_groups(tmp_path):
    """The first two batches' worth of groups score all alike (zero advantage, filtered):
    batch 1 takes more groups until it has `min_batch_samples`, instead of a step on nothing."""
    config = make_config(tmp_path, ckpt=None, filter_zero_advantage=True, min_batch_samples=2)

    class AlikeFirst(FakeRunner):
        async def rollout(self, task, example_id, ctx, temperature, policy_version):
            rollout = await super().rollout(task, example_id, ctx, temperature, policy_version)
            rollout.reward = 0.0 if self.rollouts <= 8 else rollout.reward
            return rollout

    logged: list[tuple[int, dict]] = []
    orchestrator = Orchestrator(config, [AlikeFirst()], FakePool(), lambda m, s: logged.append((s, m)))
    results = asyncio.run(run_with_trainer(orchestrator, config))
    assert sorted(results) == [1, 2, 3, 4]
    batches = {s: m for s, m in logged if "rollouts" in m}
    assert batches[1]["rollouts"] > config.batch_size and batches[1]["samples/zero_advantage_filtered"] >= 8
    assert all(m["samples/trained"] >= 2 for m in batches.values()), batches
    for ranks in results.values():
        assert sum(int(mb["loss_mask"].sum()) for r in ranks for mb in r) > 0


def test_the_floor_is_at_most_a_batch():
    with pytest.raises(ValueError, match=r"min_batch_samples \(8\) must be at most batch_size \(4\)"):
        make_config("/tmp", min_batch_samples=8)
