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
import zlib
from typing import Any

from rlkube.config import EnvConfig
from rlkube.envs.in_process import ENGINE_LOST, recording_served_versions, resolve_path, serving
from rlkube.orchestrator.types import Rollout, Sample

logger = logging.getLogger(__name__)


class TaskSampler:
    """Cycles through a taskset in a fresh seeded order every epoch; resumable from its state."""

    def __init__(self, num_tasks: int, seed: int):
        if num_tasks == 0:
            raise ValueError("the environment has no tasks")
        self.num_tasks, self.seed = num_tasks, seed
        self.epoch, self.cursor = 0, 0
        self._order = self._shuffled(0)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(self.num_tasks))
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next(self) -> int:
        if self.cursor == self.num_tasks:
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._shuffled(self.epoch)
        self.cursor += 1
        return self._order[self.cursor - 1]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = state["epoch"], state["cursor"]
        self._order = self._shuffled(self.epoch)


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


def lost_its_engine(rollout: Rollout) -> bool:
    """Whether the rollout failed only because its inference replica went away mid-call (on the
    lean path; verifiers' full path words it through the OpenAI SDK: "Connection error.")."""
    error = rollout.error or ""
    return error.startswith("ProviderError: ") and any(
        error.removeprefix("ProviderError: ").startswith(m) for m in (*ENGINE_LOST, "Connection error")
    )


class EnvRunner:
    """One verifiers environment, its tasks, and rollouts of them."""

    def __init__(self, config: EnvConfig, env: Any, seed: int):
        self.config = config
        self.name = config.name or config.id
        self.env = env
        taskset = env.taskset
        if not taskset.bounded:
            raise ValueError(f"environment '{self.name}': its taskset is infinite; bound it with its args")
        self.tasks = list(taskset)
        self.sampler = TaskSampler(len(self.tasks), seed + zlib.crc32(self.name.encode()))
        self.rollout_path = resolve_path(env, config.rollout_path, self.name)

    def serving(self):
        """The context the env serves rollouts in: the lean in-process path where it applies
        (`rlkube.envs.in_process`), else verifiers' `env.serving()`."""
        return serving(self.env, self.rollout_path)

    def next_task(self) -> tuple[str, Any]:
        """(example id, task): the id is the task's stable key (sticky routing, metrics)."""
        task = self.tasks[self.sampler.next()]
        return str(task.key), task

    async def rollout(self, task: Any, example_id: str, ctx: Any, temperature: float, policy_version) -> Rollout:
        """`policy_version()` reads the clock: once before (the rollout's oldest version) and
        once after (its newest)."""
        start = policy_version()
        with recording_served_versions() as served:
            try:
                episode = await self.env.run_episode(task, ctx)
            except Exception as e:  # noqa: BLE001 - a rollout failure is data, not a crash
                logger.warning("rollout of %s/%s failed: %s", self.name, example_id, e)
                return Rollout(self.name, example_id, 0.0, [], start, policy_version(), error=f"{type(e).__name__}: {e}")
        rollout = episode_to_rollout(episode, self.name, example_id, temperature, start, policy_version())
        rollout.served_versions = served
        return rollout


async def run_group(runner, pool, example_id: str, task: Any, group_size: int, temperature: float, policy_version,
                    retry_after_s: float, model: str | None = None) -> list[Rollout]:
    """`group_size` rollouts of one task on its sticky replica, each once the pool has a slot.

    Rollouts whose replica died or restarted mid-call (`lost_its_engine`) say nothing about the
    policy or the env: they run again after `retry_after_s`, once the orchestrator's watcher
    has the replica back on the current policy. What the orchestrator runs in-process, and
    what an env worker runs for it (`rlkube.orchestrator.env_worker`), requesting the `model`
    the orchestrator names (`InferencePool.request_model` when None)."""
    ctx = pool.context_for(runner.name, example_id, model)

    async def one() -> Rollout:
        async with pool.slot():
            return await runner.rollout(task, example_id, ctx, temperature, policy_version)

    group = list(await asyncio.gather(*(one() for _ in range(group_size))))
    while lost := [i for i, rollout in enumerate(group) if lost_its_engine(rollout)]:
        logger.warning("%d rollout(s) of %s/%s lost their inference replica: re-running them",
                       len(lost), runner.name, example_id)
        await asyncio.sleep(retry_after_s)
        for i, rollout in zip(lost, await asyncio.gather(*(one() for _ in lost))):
            group[i] = rollout
    return group
