"""Training environments: which task comes next, and one scored rollout of it.

Rollouts run through verifiers' training client (`TrainClientConfig`): it renders the prompt
to token ids with the `renderers` package, calls vLLM's token-in/token-out
`/inference/v1/generate`, and records the sampled ids and their logprobs on the trace. So the
trainer sees exactly the tokens the engine sampled, never a re-tokenization of text. Envs whose
harnesses run in-process take the lean path (`rlkube.envs.in_process`): the same records,
without the local HTTP hop to verifiers' interception server.
"""

import asyncio
import logging
import random
import statistics
import time
import zlib
from typing import Any

import numpy as np

from rlkube.config import DifficultyConfig, EnvConfig
from rlkube.envs.in_process import ENGINE_LOST, recording_served_versions, resolve_path, serving
from rlkube.histogram import Histogram
from rlkube.orchestrator.judge import judge_lost
from rlkube.rollout_types import Rollout, Sample

logger = logging.getLogger(__name__)


class TaskSampler:
    """Cycles through a taskset in a fresh seeded order every epoch; resumable from its state.

    With `difficulty` (`orchestrator.difficulty`), a task labelled easy or hard by its newest
    group (`record`) runs when its turn comes only with the keep probability of its label, and
    is skipped otherwise; a whole pass of skips returns the next task all the same. The draws
    are seeded by position, so a resumed sampler skips what the uninterrupted one would."""

    def __init__(self, num_tasks: int, seed: int, difficulty: DifficultyConfig | None = None):
        if num_tasks == 0:
            raise ValueError("the environment has no tasks")
        self.num_tasks, self.seed, self.difficulty = num_tasks, seed, difficulty
        self.epoch, self.cursor = 0, 0
        self._order = self._shuffled(0)
        self.labels: dict[int, str] = {}
        """Task index -> "easy" or "hard", by its newest group; unlabelled tasks always run."""
        self.skipped = 0

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(self.num_tasks))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def _advance(self) -> int:
        if self.cursor == self.num_tasks:
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        self.cursor += 1
        return self._order[self.cursor - 1]

    def _runs(self, index: int) -> bool:
        label = self.labels.get(index)
        if label is None:
            return True
        keep = self.difficulty.easy_keep if label == "easy" else self.difficulty.hard_keep
        return random.Random(hash((self.seed, self.epoch, self.cursor))).random() < keep

    def next(self) -> int:
        for _ in range(self.num_tasks - 1):
            if self._runs(index := self._advance()):
                return index
            self.skipped += 1
        return self._advance()

    def record(self, index: int, mean_reward: float) -> None:
        """Label task `index` by the mean reward of its newest group."""
        if self.difficulty is None:
            return
        if mean_reward >= self.difficulty.easy_threshold:
            self.labels[index] = "easy"
        elif mean_reward <= self.difficulty.hard_threshold:
            self.labels[index] = "hard"
        else:
            self.labels.pop(index, None)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor, "labels": {str(i): label for i, label in self.labels.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self._order = self._shuffled(self.epoch)
        self.labels = {int(i): label for i, label in state.get("labels", {}).items()}


def episode_to_rollout(episode: Any, env_name: str, example_id: str, temperature: float, policy_min: int, policy_max: int) -> Rollout:
    """A verifiers `Episode` as a training rollout: each trainable branch of each trainable
    agent's trace is one sample (multi-turn conversations that extend token-exactly are a
    single branch). Untrainable agents (a simulated user, a judge) are context, not samples."""
    traces = episode.traces
    samples = [
        Sample(
            token_ids=list(branch.token_ids),
            loss_mask=list(branch.sampled_mask),
            logprobs=list(branch.logprobs),
            temperature=temperature,
            routed_experts=None if (routing := branch.routed_experts) is None else routing.astype(np.int16),
        )
        for trace in traces
        if trace.agent.trainable
        for branch in trace.branches
        if branch.trainable
    ]
    errors = list(episode.errors) + [e for t in traces for e in t.errors]
    error = f"{errors[-1].type}: {errors[-1].message}" if errors and not episode.ok else None
    metrics: dict[str, float] = {}
    for trace in traces:
        metrics.update({k: float(v) for k, v in trace.metrics.items() if v is not None})
    return Rollout(
        env=env_name,
        example_id=example_id,
        reward=statistics.fmean(t.reward for t in trained) if (trained := [t for t in traces if t.agent.trainable]) else 0.0,
        samples=samples,
        policy_min=policy_min,
        policy_max=policy_max,
        num_turns=sum(t.num_turns for t in traces if t.agent.trainable),
        is_truncated=any(t.is_truncated for t in traces),
        error=error,
        metrics=metrics,
    )


def stamp_token_versions(samples: list[Sample], calls: list[list[str]]) -> bool:
    """Set each sample's `policy_versions` from the engine's per-call token versions: the
    model calls' completion tokens, in call order, are the samples' sampled tokens in order
    (each turn's completion is one run of the loss mask). Nothing is set, and False returned,
    when they do not line up token for token or a token's version is unknown."""
    versions = [v for call in calls for v in call]
    if not versions or len(versions) != sum(s.num_loss_tokens for s in samples):
        return False
    if not all(v == "default" or v.isdigit() for v in versions):
        return False
    steps = iter(0 if v == "default" else int(v) for v in versions)
    for sample in samples:
        sample.policy_versions = [next(steps) if m else -1 for m in sample.loss_mask]
    return True


REPLICA_LOST = "ReplicaLost"
"""How a rollout that failed for want of its replica (or of its judge: `judge_lost`) is marked
(`Rollout.error` starts with it and ": "), in this process or an env worker's, so that the
orchestrator re-issues it."""
UNREACHABLE = (ENGINE_LOST[0], "ClientPayloadError", "HTTP 502", "HTTP 503", "HTTP 504",
               "Connection error", "Error code: 502", "Error code: 503", "Error code: 504")
"""Model-call errors that mean no replica answered: the lean path's `_EngineHTTP` wording
(`rlkube.envs.in_process.ENGINE_LOST`, a response cut off, "HTTP <status>") and verifiers' full
path's (through the OpenAI SDK: "Connection error.", "Error code: <status>"). Refused or reset
connections, failed name resolution, and the 5xx a restarting server or its proxy answers with
(a 500 is the engine failing the request: an error, unless the replica then fails its health
check: `lost_with_its_engine`)."""
TIMED_OUT = (ENGINE_LOST[1], "Request timed out")
"""A timeout is the replica's fault only if it was marked down meanwhile; otherwise it is the
rollout's (a generation longer than `client.timeout_s`) and stays an error."""


def lost_its_replica(error: str | None, marked_down: bool) -> bool:
    """Whether a rollout's error is its inference replica's (unreachable, restarting), not the
    env's or the model's: such a rollout says nothing about the policy and is re-issued."""
    if not (error or "").startswith("ProviderError: "):
        return False
    message = error.removeprefix("ProviderError: ")
    return message.startswith(UNREACHABLE) or (marked_down and message.startswith(TIMED_OUT))


def lost_on(pool, replica: str, started: float, error: str | None) -> bool:
    """Whether a call on the pool's `replica` begun at `started` (monotonic) that ended with
    `error` lost its replica: unreachable or restarting (`lost_its_replica`), or it left the
    pool meanwhile (scaled down: a stopping engine fails what it still had in flight, vLLM
    with an engine error)."""
    return lost_its_replica(error, pool.down_since(replica, started)) or (
        error is not None and replica not in pool.base_urls)


SERVER_ERROR = ("HTTP 5", "Error code: 5")
"""A model call the replica answered with a 5xx (`_EngineHTTP`'s and the OpenAI SDK's wording)."""
HEALTH_PROBE_S = 5.0


async def lost_with_its_engine(replica: str, error: str | None) -> bool:
    """Whether a rollout that failed with a server error failed because the replica's engine
    died: vLLM answers the requests it holds with a 500 (EngineDeadError) as a SIGTERM stops it,
    for example in a scale-down before the pool has read the new replica list. Then the
    replica no longer passes its health check; a 500 from a replica that does is the engine
    failing that request, an error of the rollout."""
    if not (error or "").removeprefix("ProviderError: ").startswith(SERVER_ERROR):
        return False
    from rlkube.inference.client import is_healthy

    return not await is_healthy(replica, HEALTH_PROBE_S)


def replica_lost(rollout: Rollout) -> bool:
    """Whether the rollout was marked as lost with its replica (`REPLICA_LOST`)."""
    return (rollout.error or "").startswith(f"{REPLICA_LOST}: ")


class EnvRunner:
    """One verifiers environment, its tasks, and rollouts of them."""

    def __init__(self, config: EnvConfig, env: Any, seed: int, difficulty: DifficultyConfig | None = None):
        self.config = config
        self.name = config.name or config.id
        self.env = env
        taskset = env.taskset
        if not taskset.bounded:
            raise ValueError(f"environment '{self.name}': its taskset is infinite; bound it with its args")
        self.tasks = list(taskset)
        self.index_of = {str(task.key): i for i, task in enumerate(self.tasks)}
        self.sampler = TaskSampler(len(self.tasks), seed + zlib.crc32(self.name.encode()), difficulty)
        self.rollout_path = resolve_path(env, config.rollout_path, self.name)

    def serving(self):
        """The context the env serves rollouts in: the lean in-process path where it applies
        (`rlkube.envs.in_process`), else verifiers' `env.serving()`."""
        return serving(self.env, self.rollout_path)

    def next_task(self) -> tuple[str, Any]:
        """(example id, task): the id is the task's stable key (sticky routing, metrics)."""
        task = self.tasks[self.sampler.next()]
        return str(task.key), task

    def record(self, example_id: str, rewards: list[float]) -> None:
        """The rewards of a finished group of the task (`orchestrator.difficulty`)."""
        self.sampler.record(self.index_of[example_id], sum(rewards) / len(rewards))

    async def rollout(self, task: Any, example_id: str, ctx: Any, temperature: float, policy_version) -> Rollout:
        """`policy_version()` reads the clock: once before (the rollout's oldest version) and
        once after (its newest). Its wall time goes into its metrics (`rollout/latency_s`)."""
        start, started = policy_version(), time.monotonic()
        with recording_served_versions() as served:
            try:
                episode = await self.env.run_episode(task, ctx)
            except Exception as e:  # noqa: BLE001 - a rollout failure is data, not a crash
                logger.warning("rollout of %s/%s failed: %s", self.name, example_id, e)
                rollout = Rollout(self.name, example_id, 0.0, [], start, policy_version(), error=f"{type(e).__name__}: {e}")
                rollout.metrics |= Histogram("rollout/latency_s", [time.monotonic() - started]).counts()
                return rollout
        rollout = episode_to_rollout(episode, self.name, example_id, temperature, start, policy_version())
        rollout.metrics |= Histogram("rollout/latency_s", [time.monotonic() - started]).counts()
        rollout.served_versions = served.versions
        stamp_token_versions(rollout.samples, served.calls)
        return rollout


async def run_group(runner, pool, example_id: str, task: Any, size: int, temperature: float, policy_version,
                    model: str | None = None) -> list[Rollout]:
    """`size` rollouts of one task, each on the task's replica once the pool has a slot
    (`InferencePool.replica_for`: the sticky one, or a healthy one while it is down).

    A rollout whose replica went away or is restarting comes back marked `REPLICA_LOST` (and
    the replica is marked down, so the next rollouts go elsewhere); the orchestrator re-issues
    it (`Reissuer`). So is one whose judge stayed unreachable (`rlkube.orchestrator.judge`),
    its replica kept. What the orchestrator runs in-process, and what an env worker runs for it
    (`rlkube.orchestrator.env_worker`), requesting the `model` the orchestrator names
    (`InferencePool.request_model` when None)."""

    async def one() -> Rollout:
        async with pool.slot():
            replica, started = pool.replica_for(runner.name, example_id), time.monotonic()
            ctx = pool.context_at(replica, model)
            rollout = await pool.call_on(replica, runner.rollout(task, example_id, ctx, temperature, policy_version))
        if rollout is None:  # abandoned: the replica stopped answering
            return Rollout(runner.name, example_id, 0.0, [], policy_version(), policy_version(),
                           error=f"{REPLICA_LOST}: {replica}: abandoned, the replica stopped answering")
        if not pool.engine_versions:  # a pool's server version is no member's policy step
            rollout.forget_engine_versions()
        if judge_lost(rollout.error):
            rollout.error = f"{REPLICA_LOST}: the judge: {rollout.error}"
        elif lost_on(pool, replica, started, rollout.error) or await lost_with_its_engine(replica, rollout.error):
            pool.mark_down(replica)
            rollout.error = f"{REPLICA_LOST}: {replica}: {rollout.error}"
        else:
            pool.served(replica)
        return rollout

    return list(await asyncio.gather(*(one() for _ in range(size))))


class Reissuer:
    """The scheduler's `run_group` around the orchestrator's or the env workers' own: the
    rollouts of a group that lost their replica (or judge) are run again (as a smaller group of the same
    task) until none is lost, so a group always comes back whole and scored on its merits.
    The first re-issue goes at once (a healthy replica takes it); later ones wait
    `retry_after_s` each (every replica is down: the watcher brings them back)."""

    def __init__(self, run_group, retry_after_s: float):
        self.run_group, self.retry_after_s = run_group, retry_after_s
        self.reissued = 0
        """Rollouts re-issued since the start (each once, however many times it ran again)."""

    async def __call__(self, runner, example_id: str, task: Any, size: int) -> list[Rollout]:
        group = await self.run_group(runner, example_id, task, size)
        reissued: set[int] = set()
        while lost := [i for i, rollout in enumerate(group) if replica_lost(rollout)]:
            if reissued:
                await asyncio.sleep(self.retry_after_s)
            else:
                logger.warning("%d rollout(s) of %s/%s lost their inference replica or judge (%s): re-issued",
                               len(lost), runner.name, example_id, group[lost[0]].error)
            reissued.update(lost)
            for i, rollout in zip(lost, await self.run_group(runner, example_id, task, len(lost))):
                group[i] = rollout
        self.reissued += len(reissued)
        return group
