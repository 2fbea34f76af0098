"""Env workers over real gRPC: groups out, scored rollouts back, bounds, and lost or hung workers.

The protocol tests drive the EnvWorkers stream by hand or with in-process workers (`work`);
the process tests run real `rlkube env-worker` processes with the real reverse_text env
against the fake engine, beside an orchestrator in this process."""

import asyncio
import contextlib
import os
import signal
import sys
import threading
import time

import grpc
import numpy as np
import pytest
from rlkube import auth
from rlkube.config import OrchestratorConfig, write_toml
from rlkube.config.inference import POLICY_ADAPTER
from rlkube.envs import load_env
from rlkube.orchestrator.app import build_runners
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.orchestrator import Orchestrator
from rlkube.orchestrator.rollouts import EnvRunner, run_group
from rlkube.orchestrator.workers import WorkerHub
from rlkube.rollout_types import Rollout, Sample
from rlkube.scopes import WORK
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.env_workers import work
from rlkube.transport.rollout import from_message, to_message
from rlkube.transport.server import start_server, stop_server

from tests.fixtures.inference import free_port
from tests.fixtures.network import VanishingPeerProxy
from tests.fixtures.processes import spawn
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread
from tests.orchestrator.test_orchestrator import (
    FakePool,
    FakeRunner,
    make_config,
    run_with_trainer,
    trainer_thread,
)


async def eventually(predicate, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def instant_group(task: pb.GroupTask) -> list[Rollout]:
    """What a FakeRunner group would be: rollout j of task i scores (i + j) % 2."""
    i = int(task.example_id)
    sample = Sample([1, 2, 3, 4 + i], [False, False, True, True], [0.0, 0.0, -0.1, -0.2], 1.0)
    return [Rollout("fake", task.example_id, float((i + j) % 2), [sample], 0, 0) for j in range(task.group_size)]


def hello(worker_id: str, max_groups: int, envs=("fake",)) -> pb.WorkerMessage:
    return pb.WorkerMessage(hello=pb.WorkerHello(worker_id=worker_id, max_groups=max_groups, envs=envs))


def answer(task: pb.GroupTask) -> pb.WorkerMessage:
    rollouts = [to_message(r) for r in instant_group(task)]
    return pb.WorkerMessage(result=pb.GroupResult(dispatch_id=task.dispatch_id, rollouts=rollouts))


def test_a_rollout_crosses_the_wire_unchanged():
    sample = Sample([5, 6, 7], [False, True, True], [0.0, -0.1234567890123, -1e-300], 0.7)
    rollout = Rollout("e", "x", 0.5, [sample], 3, 4, num_turns=2, is_truncated=True, metrics={"m": 1.5},
                      served_versions=["3", "4"])
    assert from_message(to_message(rollout), 3, 4) == rollout
    sample.policy_versions = [-1, 3, 4]  # a rollout across a weight update: each token's policy
    assert from_message(to_message(rollout), 3, 4) == rollout
    rollout.error = "ProviderError: engine unreachable"
    assert from_message(to_message(rollout), 3, 4) == rollout
    assert from_message(to_message(rollout), 3, 4).samples[0].routed_experts is None
    sample.routed_experts = np.array([[[0, 3]], [[2, 1]], [[1, 3]]], dtype=np.int16)  # MoE: 1 layer, top-2
    assert np.array_equal(from_message(to_message(rollout), 3, 4).samples[0].routed_experts, sample.routed_experts)


def test_a_lost_workers_groups_are_reissued_once_and_its_late_answers_discarded():
    async def scenario():
        clock = PolicyClock(async_level=1)
        hub = WorkerHub(clock, group_size=2, envs=["fake"], timeout_s=60)
        server = await start_server(None, "127.0.0.1", 0, workers=hub)
        groups = [asyncio.ensure_future(hub.run_group(FakeRunner(), str(i), i)) for i in range(3)]
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                lost = pb_grpc.EnvWorkersStub(channel).Work(metadata=auth.grpc_metadata(WORK))
                await lost.write(hello("lost", max_groups=2))
                first = [await lost.read() for _ in range(2)]
                lost.cancel()  # the worker dies holding two groups
                await eventually(lambda: hub.reissued == 2 and not hub.sessions, what="the session to end")

                clock.advance(1)
                survivor = pb_grpc.EnvWorkersStub(channel).Work(metadata=auth.grpc_metadata(WORK))
                await survivor.write(hello("survivor", max_groups=4))
                tasks = [await survivor.read() for _ in range(3)]
                assert [t.example_id for t in tasks] == ["0", "1", "2"], "re-issued ahead of the newer group"
                assert {t.dispatch_id for t in tasks}.isdisjoint(t.dispatch_id for t in first)
                await survivor.write(answer(first[0]))  # the lost worker's dispatch: not trained
                clock.advance(2)
                for task in tasks:
                    await survivor.write(answer(task))
                results = await asyncio.wait_for(asyncio.gather(*groups), 10)
                survivor.cancel()
        finally:
            await stop_server(server, 1)
        return hub, results

    hub, results = asyncio.run(scenario())
    assert hub.reissued == 2 and hub.discarded == 1
    assert [[r.reward for r in group] for group in results] == [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]
    assert all((r.policy_min, r.policy_max) == (1, 2) for group in results for r in group), \
        "stamped with the clock at dispatch and at return"


def test_a_worker_whose_pod_vanished_loses_its_groups_to_keepalive(short_keepalive):
    """No reset reaches the orchestrator from a vanished pod: its keepalive pings go unanswered,
    the session ends within seconds (`short_keepalive`), and the group it held is re-issued."""
    async def scenario():
        hub = WorkerHub(PolicyClock(async_level=1), group_size=2, envs=["fake"], timeout_s=600)
        server = await start_server(None, "127.0.0.1", 0, workers=hub)
        proxy = VanishingPeerProxy(server.port)
        group = asyncio.ensure_future(hub.run_group(FakeRunner(), "0", 0))
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
                call = pb_grpc.EnvWorkersStub(channel).Work(metadata=auth.grpc_metadata(WORK))
                await call.write(hello("vanishing", max_groups=1))
                await call.read()
                proxy.vanish_and_point_to(server.port)
                started = time.monotonic()
                await eventually(lambda: hub.reissued == 1, 60, "keepalive to end the session")
                call.cancel()
            group.cancel()
        finally:
            proxy.close()
            await stop_server(server, 1)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 30


def test_a_worker_without_the_envs_is_refused():
    async def scenario():
        hub = WorkerHub(PolicyClock(async_level=1), group_size=2, envs=["fake"], timeout_s=60)
        server = await start_server(None, "127.0.0.1", 0, workers=hub)
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                call = pb_grpc.EnvWorkersStub(channel).Work(metadata=auth.grpc_metadata(WORK))
                await call.write(hello("stale", max_groups=2, envs=["other"]))
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call.read()
        finally:
            await stop_server(server, 1)
        return refused.value

    refused = asyncio.run(scenario())
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and "['fake']" in refused.details()


def test_a_hung_worker_does_not_stall_the_run(tmp_path):
    """A worker that takes groups and never answers, with its connection open, joins first and
    takes every group: they time out to the worker that serves, and every step is trained."""
    port = free_port()
    config = make_config(tmp_path, ckpt=None, env_workers=2, env_worker_timeout_s=0.5, client={"max_concurrent": 8})
    address = f"127.0.0.1:{port}"

    async def never(task):
        await asyncio.Event().wait()

    async def instant(task):
        return instant_group(task)

    async def scenario():
        logged = []
        orchestrator = Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: logged.append(m))
        hub = orchestrator.workers
        workers = [asyncio.ensure_future(work(address, hello("hung", 4).hello, never))]

        async def then_a_serving_worker():
            await eventually(lambda: hub.sessions and hub.sessions[0].room() == 0, what="the hung worker to be full")
            workers.append(asyncio.ensure_future(work(address, hello("serving", 4).hello, instant)))

        joining = asyncio.ensure_future(then_a_serving_worker())
        try:
            results = await run_with_trainer(orchestrator, config, port=port)
        finally:
            for task in [joining, *workers]:
                task.cancel()
            await asyncio.gather(joining, *workers, return_exceptions=True)
        return hub, results, [m for m in logged if "rollouts" in m]

    hub, results, logged = asyncio.run(scenario())
    assert sorted(results) == [1, 2, 3, 4]
    assert hub.reissued >= 4 and hub.discarded == 0, "the hung worker's groups ran elsewhere, once"
    assert logged[-1]["env_workers/connected"] == 2 and logged[-1]["env_workers/reissued_groups"] >= 4


# --- real worker processes --------------------------------------------------------------


class SlowInference(FakeInference):
    """The fake engine taking `delay_s` per call, counting the calls it serves at once."""

    def __init__(self, *args, delay_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay_s, self.active, self.most_active = delay_s, 0, 0

    async def generate(self, request):
        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            await asyncio.sleep(self.delay_s)
            return await super().generate(request)
        finally:
            self.active -= 1


def reverse_text_config(tmp_path, model, url: str, **overrides) -> OrchestratorConfig:
    data = {
        "output_dir": tmp_path, "model": {"name": str(model)}, "max_steps": 3, "batch_size": 8, "group_size": 4,
        "seq_len": 512, "filter_zero_advantage": False, "envs": [{"args": {"num_examples": 20}}],
        "sampling": {"max_tokens": 16}, "env_workers": 2, "rollouts": {"port": free_port()},
        "client": {"base_urls": [url], "max_concurrent": 16, "resync_interval_s": 0.2},
    }
    return OrchestratorConfig.model_validate(data | overrides)


@contextlib.contextmanager
def worker_processes(config: OrchestratorConfig, tmp_path):
    """`rlkube env-worker @ orchestrator.toml`, `config.env_workers` times (pid -> process)."""
    path = tmp_path / "orchestrator.toml"
    write_toml(config, path)
    argv = [sys.executable, "-m", "rlkube.entrypoints.env_worker", "@", str(path)]
    processes = []
    try:
        for i in range(config.env_workers):
            processes.append(spawn(argv, log=tmp_path / f"env-worker-{i}.log"))
        yield {p.pid: p for p in processes}
    finally:
        for process in processes:
            process.kill()
            process.wait(10)


def pid_of(session) -> int:
    return int(session.worker_id.rsplit(":", 1)[1])


async def run_monitored(orchestrator, config, check) -> dict:
    """The run with a fake trainer once every worker joined (they take a while to import their
    environments), calling `check()` every 10 ms meanwhile."""
    server = await start_server(orchestrator, "127.0.0.1", config.rollouts.port, workers=orchestrator.workers)
    results: dict = {}
    trainer = threading.Thread(target=trainer_thread, args=(server.port, config.max_steps, 2, results))

    async def monitor():
        while True:
            await check()
            await asyncio.sleep(0.01)

    watching = asyncio.ensure_future(monitor())
    try:
        await eventually(lambda: orchestrator.workers is None or len(orchestrator.workers.sessions) == config.env_workers,
                         300, "the workers to join")
        trainer.start()
        await orchestrator.run()
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await asyncio.to_thread(trainer.join, 30)
        await stop_server(server, 1)
    return results


def test_worker_processes_stay_bounded_and_a_killed_ones_groups_are_reissued_once(tiny_model, tmp_path):
    """Two `rlkube env-worker` processes under a slow engine: the groups in flight (waiting or
    held) never exceed `max_groups_in_flight`, nor the rollouts at the engine
    `client.max_concurrent`; once both hold groups (and some finished) one is killed, and exactly the groups it
    held run again on the other, none answered twice."""
    fake = SlowInference(str(tiny_model), stop_token_id=3, delay_s=0.2)
    killed: dict[str, int] = {}
    with FakeInferenceThread(fake) as server:
        # over_provision 1: this counts the hub's re-issues exactly; with the default 2 the stopped worker's groups
        # count as stragglers and two answers came back for groups no longer waited for (discarded, not trained)
        config = reverse_text_config(tmp_path, tiny_model, server.url, max_steps=4, over_provision=1.0)
        orchestrator = Orchestrator(config, build_runners(config), pool_for(config), lambda m, s: None)
        hub = orchestrator.workers

        with worker_processes(config, tmp_path) as processes:
            async def check():
                held = [len(s.held) for s in hub.sessions]
                assert sum(held) + len(hub.waiting) <= config.max_groups_in_flight
                assert all(h <= s.max_groups for h, s in zip(held, hub.sessions))
                if killed or len(held) < 2 or not all(held) or fake.generate_requests < 16:
                    return
                killed["most_active"] = fake.most_active
                victim = hub.sessions[0]
                os.kill(pid_of(victim), signal.SIGSTOP)  # no answer leaves it from here on
                await asyncio.sleep(0.3)  # answers already on the wire arrive
                killed["held"], killed["reissued"] = len(victim.held), hub.reissued
                processes[pid_of(victim)].kill()

            results = asyncio.run(asyncio.wait_for(run_monitored(orchestrator, config, check), 400))
    assert sorted(results) == [1, 2, 3, 4]
    assert 0 < killed["most_active"] <= config.client.max_concurrent, "rollouts at the engine, all workers together"
    assert killed["held"] >= 1 and hub.reissued - killed["reissued"] == killed["held"]
    assert hub.discarded == 0


def timeless(rollout: Rollout) -> dict:
    """A rollout as a dict without its wall time (`rollout/latency_s`), which no two runs share."""
    data = rollout.to_dict()
    data["metrics"] = {k: v for k, v in data["metrics"].items() if not k.startswith("rollout/latency_s/")}
    return data


def test_workers_produce_the_in_process_rollouts(tiny_model, tmp_path):
    """The same tasks through a worker process and in-process, on the same deterministic engine:
    the same token ids, masks, logprobs and rewards. The worker requests the model the
    orchestrator names with each group (here a LoRA run's adapter, as after its first policy)."""
    fake = FakeInference(str(tiny_model), stop_token_id=3)
    fake.adapter = "/w/step_1"
    with FakeInferenceThread(fake) as server:
        config = reverse_text_config(tmp_path, tiny_model, server.url, env_workers=1)
        config.client.lora_adapter = POLICY_ADAPTER
        runner, pool = EnvRunner(config.envs[0], load_env(config.envs[0]), seed=0), pool_for(config)
        tasks = [runner.next_task() for _ in range(4)]

        async def both():
            hub = WorkerHub(PolicyClock(async_level=1), config.group_size, [runner.name], timeout_s=60,
                            request_model=lambda: POLICY_ADAPTER)
            grpc_server = await start_server(None, "127.0.0.1", config.rollouts.port, workers=hub)
            try:
                remote = await asyncio.wait_for(asyncio.gather(*(hub.run_group(runner, *t) for t in tasks)), 60)
            finally:
                await stop_server(grpc_server, 1)
            async with runner.serving():
                # One rollout alone first: renderers' module-level lock must not be contended in
                # this test's event loop (tests/orchestrator/test_rollouts.py says why).
                await runner.rollout(tasks[0][1], tasks[0][0], pool.context_for(runner.name, tasks[0][0]), 1.0, lambda: 0)
                local = [await run_group(runner, pool, *t, config.group_size, config.sampling.temperature,
                                         lambda: 0) for t in tasks]
            return remote, local

        with worker_processes(config, tmp_path):
            remote, local = asyncio.run(both())
    assert [[timeless(r) for r in g] for g in remote] == [[timeless(r) for r in g] for g in local]
    remote_requests = 4 * config.group_size
    assert set(fake.requested_models[:remote_requests]) == {POLICY_ADAPTER}
    assert set(fake.requested_models[remote_requests:]) == {str(tiny_model)}, "in-process: policy 0, the base model"
    assert all(r.error is None and r.samples for g in remote for r in g)
    assert len({r.reward for g in remote for r in g}) > 1, "rewards vary, so the comparison says something"


def pool_for(config: OrchestratorConfig) -> InferencePool:
    return InferencePool(config.client, config.model.name, config.model.name, config.sampling)
