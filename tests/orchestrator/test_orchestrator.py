"""The orchestrator's protocol with the trainer, over real gRPC, with instant fake rollouts:
batches per rank, policy reports -> pause/load/resume -> clock, checkpoints and resume."""

import asyncio
import contextlib
import json
import shutil
import threading
import urllib.request

import pytest
from rlkube.config import EnvConfig, OrchestratorConfig
from rlkube.orchestrator import checkpoint
from rlkube.orchestrator.eval import EVAL_REWARD
from rlkube.orchestrator.orchestrator import Orchestrator
from rlkube.orchestrator.rollouts import TaskSampler
from rlkube.orchestrator.status import PrometheusMetrics, make_app, start_http
from rlkube.rollout_types import Rollout, Sample
from rlkube.transport.client import RolloutClient
from rlkube.transport.server import start_server, stop_server


class FakeRunner:
    """Task i has reward pattern: rollout j of a group scores (i + j) % 2 (mixed groups)."""

    def __init__(self, name="fake"):
        self.name, self.config = name, EnvConfig(id=name)
        self.sampler = TaskSampler(100, seed=0)
        self.rollouts = 0

    def next_task(self):
        i = self.sampler.next()
        return str(i), i

    def record(self, example_id, rewards):
        self.sampler.record(int(example_id), sum(rewards) / len(rewards))

    async def rollout(self, task, example_id, ctx, temperature, policy_version):
        start = policy_version()
        await asyncio.sleep(0)
        self.rollouts += 1
        sample = Sample([1, 2, 3, 4 + task], [False, False, True, True], [0.0, 0.0, -0.1, -0.2], temperature)
        return Rollout(self.name, example_id, float((task + self.rollouts) % 2), [sample], start, policy_version())


class FakePool:
    request_model = "model"
    base_urls = ("http://fake",)
    engine_versions = True

    def __init__(self):
        self.loads = []

    def replica_for(self, env, example_id):
        return "http://fake"

    def context_at(self, replica, model=None):
        return None

    def mark_down(self, replica):
        pass

    def down_since(self, replica, since):
        return False

    async def call_on(self, replica, call):
        return await call

    def served(self, replica):
        pass

    def metrics(self):
        return {}

    def slot(self):
        return contextlib.nullcontext()

    async def load_policy(self, step, location, timeout_s):
        self.loads.append((step, location))

    async def sync(self, policy, timeout_s, fresh=False):
        return []

    async def watch(self, policy, timeout_s):
        await asyncio.Event().wait()


def make_config(tmp_path, **overrides) -> OrchestratorConfig:
    data = {
        "output_dir": tmp_path, "max_steps": 4, "batch_size": 4, "group_size": 2, "seq_len": 16,
        "async_level": 1, "ckpt": {"interval": 2}, "filter_zero_advantage": False,
    }
    return OrchestratorConfig.model_validate(data | overrides)


def trainer_thread(port, max_steps, world_size, results, start_step=1):
    """A fake trainer: every rank fetches, then rank 0 reports the new policy."""
    with RolloutClient(f"127.0.0.1:{port}", timeout_s=30) as client:
        if start_step > 1:
            client.report_policy(start_step - 1, f"/w/step_{start_step - 1}")
        for step in range(start_step, max_steps + 1):
            results[step] = [client.get_batch(step, rank, world_size) for rank in range(world_size)]
            client.report_policy(step, f"/w/step_{step}")


async def run_with_trainer(orchestrator, config, world_size=2, start_step=1, resume_step=None, port=0):
    server = await start_server(orchestrator, "127.0.0.1", port, workers=orchestrator.workers)
    results: dict = {}
    thread = threading.Thread(target=trainer_thread, args=(server.port, config.max_steps, world_size, results, start_step))
    thread.start()
    try:
        await asyncio.wait_for(orchestrator.run(resume_step), timeout=60)
    finally:
        await asyncio.to_thread(thread.join, 30)
        await stop_server(server, 1)
    return results


def test_full_run_over_grpc(tmp_path):
    config = make_config(tmp_path)
    pool, logged = FakePool(), []
    orchestrator = Orchestrator(config, [FakeRunner()], pool, lambda m, s: logged.append((s, m)))
    results = asyncio.run(run_with_trainer(orchestrator, config))
    assert sorted(results) == [1, 2, 3, 4]
    for ranks in results.values():
        assert len(ranks[0]) == len(ranks[1]), "equal micro-batch counts per rank"
        loss_tokens = sum(int(mb["loss_mask"].sum()) for r in ranks for mb in r)
        assert loss_tokens == ranks[0][0]["global_loss_tokens"] == 4 * 2
    assert pool.loads == [(s, f"/w/step_{s}") for s in range(1, 5)]
    assert orchestrator.status() | {"reward": None} == {
        "phase": "finished", "step": 4, "max_steps": 4, "reward": None, "eval_reward": None, "policy_step": 4,
        "off_policy_lag": orchestrator.last_lag, "last_checkpoint_step": 4, "batch_ready_step": 4,
    }
    assert checkpoint.resolve_step(tmp_path / "checkpoints", 2) == 2
    batch_steps = [s for s, m in logged if "reward/all/mean" in m]
    assert batch_steps == [1, 2, 3, 4]
    assert all("reward/fake/mean" in m and "errored_rollouts" in m for s, m in logged if "reward/all/mean" in m)
    # the lag of every trained token, the rollouts in flight, and each weight update's latency
    assert all(m["off_policy/token_lag/count"] == m["tokens/loss"] > 0 and m["rollouts/in_flight"] >= 0
               for s, m in logged if "reward/all/mean" in m)
    assert sum(m["weights/update_latency_s/count"] for s, m in logged if "time/update_weights" in m) == 4


class TruncatingRunner(FakeRunner):
    """Every rollout of the first `truncated_tasks` tasks ends at max_tokens."""

    def __init__(self, truncated_tasks: int):
        super().__init__()
        self.truncated_tasks = truncated_tasks

    async def rollout(self, task, example_id, ctx, temperature, policy_version):
        rollout = await super().rollout(task, example_id, ctx, temperature, policy_version)
        rollout.is_truncated = task < self.truncated_tasks
        return rollout


@pytest.mark.parametrize("truncated_tasks", [0, 100])
def test_a_run_whose_completions_are_cut_at_max_tokens_is_told_once(tmp_path, caplog, truncated_tasks):
    """A batch mostly cut off at `sampling.max_tokens` (the reverse-text scenario's, 97-100 %)
    learns only what fits: the log says so once, naming the knob; a run with none cut is not."""
    config = make_config(tmp_path, sampling={"max_tokens": 8})
    orchestrator = Orchestrator(config, [TruncatingRunner(truncated_tasks)], FakePool(), lambda m, s: None)
    with caplog.at_level("WARNING", logger="rlkube.orchestrator.orchestrator"):
        asyncio.run(run_with_trainer(orchestrator, config))
    warnings = [r.getMessage() for r in caplog.records if "max_tokens" in r.getMessage()]
    if truncated_tasks == 0:
        assert warnings == []
    else:
        assert len(warnings) == 1 and warnings[0].startswith("step 1: 100% of the batch's completions"), warnings
        assert "orchestrator.sampling.max_tokens = 8" in warnings[0]


def test_resume_restores_unconsumed_batches_and_samplers(tmp_path):
    config = make_config(tmp_path, max_steps=2)
    runner = FakeRunner()
    first = Orchestrator(config, [runner], FakePool(), lambda m, s: None)
    asyncio.run(run_with_trainer(first, config))
    state = checkpoint.load(tmp_path / "checkpoints", 2)
    assert state["policy_step"] == 2 and state["policy_location"] == "/w/step_2"
    # with one-step overlap, batch 3 may exist already: it is saved, not lost
    assert set(state["batches"]) <= {"3"}

    done = Orchestrator(make_config(tmp_path, max_steps=2), [FakeRunner()], FakePool(), lambda m, s: None)
    asyncio.run(asyncio.wait_for(done.run(resume_step=2), timeout=10))
    assert done.status()["phase"] == "finished", "resuming at max_steps has nothing left to do"

    config = make_config(tmp_path, max_steps=4, ckpt={"interval": 2, "resume_step": "latest"})
    # "latest" needs the trainer's part too; here only the orchestrator's exists: a fresh start
    assert checkpoint.resolve_step(tmp_path / "checkpoints", "latest") is None
    abandoned = tmp_path / "checkpoints" / "orchestrator" / "step_6"  # from a run that got further
    shutil.copytree(tmp_path / "checkpoints" / "orchestrator" / "step_2", abandoned)
    resumed_runner, pool = FakeRunner(), FakePool()
    resumed = Orchestrator(config, [resumed_runner], pool, lambda m, s: None)
    results = asyncio.run(run_with_trainer(resumed, config, start_step=3, resume_step=2))
    assert sorted(results) == [3, 4]
    assert not (abandoned / "COMPLETE").exists() and (abandoned / "state.json").exists(), "unmarked, kept"
    assert pool.loads[0] == (2, "/w/step_2"), "policy 2 is pushed to inference before generating"
    assert resumed_runner.sampler.state_dict()["cursor"] > runner.sampler.state_dict()["cursor"]


class SolvedFirstTwo(FakeRunner):
    """Six tasks; tasks 0 and 1 are always solved, the others score mixed groups."""

    def __init__(self, difficulty):
        super().__init__()
        self.sampler = TaskSampler(6, seed=0, difficulty=difficulty)
        self.launched = []

    def next_task(self):
        example_id, task = super().next_task()
        self.launched.append(task)
        return example_id, task

    async def rollout(self, task, example_id, ctx, temperature, policy_version):
        rollout = await super().rollout(task, example_id, ctx, temperature, policy_version)
        rollout.reward = 1.0 if task < 2 else rollout.reward
        return rollout


def test_solved_tasks_stop_running_with_easy_keep_zero(tmp_path):
    """`orchestrator.difficulty`: a task whose group all solved is labelled easy when the group
    comes back and is skipped from then on; the others keep their turns, epoch after epoch."""
    config = make_config(tmp_path, max_steps=12, difficulty={"easy_keep": 0.0})
    runner, logged = SolvedFirstTwo(config.difficulty), []
    orchestrator = Orchestrator(config, [runner], FakePool(), lambda m, s: logged.append(m))
    asyncio.run(run_with_trainer(orchestrator, config))
    counts = {task: runner.launched.count(task) for task in range(6)}
    assert counts[0] == counts[1] == 1 and all(counts[t] >= 4 for t in range(2, 6)), counts
    batches = [m for m in logged if "tasks/easy" in m]
    assert len(batches) == 12 and batches[-1]["tasks/easy"] == 2 and batches[-1]["tasks/hard"] == 0
    assert sum(m["tasks/skipped"] for m in batches) == runner.sampler.skipped >= 6


class RefusingPool(FakePool):
    """A pool whose replicas refuse the first `refusals` loads, as they do while the trainer no
    longer holds the policy asked for."""

    def __init__(self, refusals):
        super().__init__()
        self.refusals = refusals

    async def load_policy(self, step, location, timeout_s):
        from rlkube.inference.client import InferenceError

        if self.refusals:
            self.refusals -= 1
            raise InferenceError(f"no weight snapshot for step {step} (held: [3, 4])")
        await super().load_policy(step, location, timeout_s)


def test_a_resumed_policy_the_trainer_no_longer_holds_is_waited_for(tmp_path, monkeypatch):
    """The trainer ran past the orchestrator's checkpoint (it holds policies 3 and 4 when the
    orchestrator resumes at 2); it follows the restart back to 2 and republishes it meanwhile."""
    from rlkube.orchestrator import orchestrator as orchestrator_module

    monkeypatch.setattr(orchestrator_module, "RESUMED_POLICY_RETRY_S", 0.01)
    config = make_config(tmp_path, max_steps=2)
    asyncio.run(run_with_trainer(Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: None), config))

    config = make_config(tmp_path, max_steps=4)
    pool = RefusingPool(refusals=2)
    resumed = Orchestrator(config, [FakeRunner()], pool, lambda m, s: None)
    results = asyncio.run(run_with_trainer(resumed, config, start_step=3, resume_step=2))
    assert sorted(results) == [3, 4] and pool.loads[0] == (2, "/w/step_2")

    config = make_config(tmp_path, max_steps=4, weights={"timeout_s": 0.05})
    never = Orchestrator(config, [FakeRunner()], RefusingPool(refusals=10**6), lambda m, s: None)
    with pytest.raises(RuntimeError, match=r"resuming at policy 2.*weights.timeout_s.*held: \[3, 4\]"):
        asyncio.run(asyncio.wait_for(never.run(resume_step=2), timeout=10))


def test_bad_requests_are_refused(tmp_path):
    config = make_config(tmp_path)
    orchestrator = Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: None)

    async def go():
        with pytest.raises(LookupError, match="outside 1..max_steps"):
            await orchestrator.get_batch(5, 0, 1, 1)
        with pytest.raises(ValueError, match="rank 2, world_size 2"):
            await orchestrator.get_batch(1, 2, 2, 1)
        with pytest.raises(ValueError, match="before batch 1 was served"):
            await orchestrator.report_policy(1, "/w")

    asyncio.run(go())


def test_status_and_metrics_endpoints(tmp_path):
    config = make_config(tmp_path)
    orchestrator = Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: None)
    prometheus = PrometheusMetrics()
    prometheus.update({"reward/all/mean": 0.25, "time/wait_for_ckpt": 1.5})

    async def go():
        runner, port = await start_http(make_app(orchestrator.status, prometheus), "127.0.0.1", 0)
        try:
            def fetch(path):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as r:
                    return r.read().decode()

            status = json.loads(await asyncio.to_thread(fetch, "/status"))
            metrics = await asyncio.to_thread(fetch, "/metrics")
            health = json.loads(await asyncio.to_thread(fetch, "/healthz"))
        finally:
            await runner.cleanup()
        return status, metrics, health

    status, metrics, health = asyncio.run(go())
    assert status == {
        "phase": "starting", "step": 0, "max_steps": 4, "reward": None, "eval_reward": None, "policy_step": 0,
        "off_policy_lag": 0, "last_checkpoint_step": None,
    }
    assert "rlkube_orchestrator_reward_all_mean 0.25" in metrics
    assert "rlkube_orchestrator_status_max_steps 4.0" in metrics
    assert health == {"ok": True, "phase": "starting"}


def test_eval_runs_at_step_zero_every_interval_and_at_the_end(tmp_path):
    config = make_config(tmp_path, max_steps=5, ckpt=None, eval={"interval": 2})
    evaluated, logged = [], []

    async def evaluate(step):
        evaluated.append(step)
        return {"eval/fake/avg@1": step / 10, EVAL_REWARD: step / 10}

    orchestrator = Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: logged.append((s, m)), evaluate)
    asyncio.run(run_with_trainer(orchestrator, config))
    assert evaluated == [0, 2, 4, 5]
    assert [(s, m["eval/fake/avg@1"]) for s, m in logged if "eval/fake/avg@1" in m] == [(0, 0.0), (2, 0.2), (4, 0.4), (5, 0.5)]
    assert orchestrator.status()["eval_reward"] == 0.5  # the last eval's, for the RLRun's Eval column


def test_a_batch_of_only_failed_rollouts_stops_the_run(tmp_path):
    config = make_config(tmp_path, ckpt=None)

    class BrokenRunner(FakeRunner):
        async def rollout(self, task, example_id, ctx, temperature, policy_version):
            return Rollout(self.name, example_id, 0.0, [], 0, 0, error="InferenceError: connection refused")

    orchestrator = Orchestrator(config, [BrokenRunner()], FakePool(), lambda m, s: None)
    with pytest.raises(RuntimeError, match="all 4 rollouts of batch 1 failed, e.g. InferenceError"):
        asyncio.run(asyncio.wait_for(orchestrator.run(), timeout=30))
    assert orchestrator.status()["phase"] == "failed"


def test_rollouts_that_lost_their_replica_are_run_again_not_trained(tmp_path):
    """A replica that dies mid-call fails its rollouts with "engine unreachable": they are run
    again (once the replica is back) instead of ending the run or entering a batch."""
    config = make_config(tmp_path, ckpt=None, client={"resync_interval_s": 0.01})

    class FlakyRunner(FakeRunner):
        lost = 0

        async def rollout(self, task, example_id, ctx, temperature, policy_version):
            if self.lost < 6:  # the first six calls hit the dead replica
                self.lost += 1
                error = "ProviderError: engine unreachable: Server disconnected"
                return Rollout(self.name, example_id, 0.0, [], 0, 0, error=error)
            return await super().rollout(task, example_id, ctx, temperature, policy_version)

    runner = FlakyRunner()
    logged = []
    orchestrator = Orchestrator(config, [runner], FakePool(), lambda m, s: logged.append((s, m)))
    results = asyncio.run(run_with_trainer(orchestrator, config))
    assert sorted(results) == [1, 2, 3, 4] and runner.lost == 6
    batches = [m for _, m in logged if "rollouts" in m]
    assert all(m["errored_rollouts"] == 0 and m["samples/trained"] == 4 for m in batches), batches


def test_a_trainer_stops_when_the_orchestrator_restarts(tmp_path):
    """A restarted orchestrator (no checkpoint: back at step 0, so batch 2 never comes while
    the trainer waits for it) answers with another instance id: the trainer stops at once."""
    from rlkube.transport.client import OrchestratorRestarted

    from tests.fixtures.inference import free_port

    config, port = make_config(tmp_path, ckpt=None), free_port()

    async def serve_until(orchestrator, trainer_calls):
        server = await start_server(orchestrator, "127.0.0.1", port)
        run = asyncio.ensure_future(orchestrator.run())
        try:
            return await asyncio.wait_for(asyncio.to_thread(trainer_calls), timeout=60)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await stop_server(server, 1)

    with RolloutClient(f"127.0.0.1:{port}", timeout_s=600) as client:
        first = Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: None)
        batch = asyncio.run(serve_until(first, lambda: client.get_batch(1, 0, 1)))
        assert batch[0]["step"] == 1

        def next_step():
            with pytest.raises(OrchestratorRestarted, match=first.instance_id):
                client.get_batch(2, 0, 1)
            with pytest.raises(OrchestratorRestarted):
                client.report_policy(1, "/w/step_1")

        second = Orchestrator(config, [FakeRunner()], FakePool(), lambda m, s: None)
        asyncio.run(serve_until(second, next_step))
        assert second.status()["step"] == 0, "the report never reached the new orchestrator"
