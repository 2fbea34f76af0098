"""Evaluation: run environments' held-out tasks against inference servers and score them.

Used by `rlkube eval` (one shot) and by the orchestrator every `eval.interval` steps
(`periodic_eval`). Rollouts go through the same verifiers training client as training
(token-in/token-out on `/inference/v1/generate`), so eval sees exactly what RL samples.

With k rollouts per example: avg@k is the mean reward over all rollouts; pass@k is the share of
examples with at least one rollout whose reward reaches `pass_threshold`; pass rate is the share
of single rollouts that pass (pass@1 estimated from all k).

With `keep_samples`, every rollout is also kept as a chat row (`chat_rows`): what `rlkube eval
--save-samples` writes for SFT distillation from a served model.

Where an eval rollout runs is the caller's `Place`: `rlkube eval` runs each once on its one
server (`on_context`); the orchestrator runs it where its pool routes training's and runs it
again when its replica was lost (`on_pool`), so that a replica restarting during an eval is not
scored as the policy's errors.
"""

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from rlkube.config import EnvConfig, SamplingConfig

logger = logging.getLogger(__name__)


@dataclass
class EvalResult:
    env: str
    k: int
    pass_threshold: float
    rewards: list[list[float]] = field(default_factory=list)
    """Per example, the rewards of its k rollouts."""
    errors: list[str] = field(default_factory=list)
    reissued: int = 0
    """Rollouts run again because their replica was lost (`on_pool`)."""
    seconds: float = 0.0
    samples: list[dict] = field(default_factory=list)
    """With `keep_samples`: every finished rollout's chat rows (`chat_rows`), in example order."""

    @property
    def num_examples(self) -> int:
        return len(self.rewards)

    @property
    def avg_at_k(self) -> float:
        flat = [r for rewards in self.rewards for r in rewards]
        return sum(flat) / len(flat) if flat else 0.0

    @property
    def pass_at_k(self) -> float:
        passed = [any(r >= self.pass_threshold for r in rewards) for rewards in self.rewards]
        return sum(passed) / len(passed) if passed else 0.0

    @property
    def pass_rate(self) -> float:
        flat = [r >= self.pass_threshold for rewards in self.rewards for r in rewards]
        return sum(flat) / len(flat) if flat else 0.0

    def metrics(self) -> dict[str, float]:
        prefix = f"eval/{self.env}"
        return {
            f"{prefix}/avg@{self.k}": self.avg_at_k,
            f"{prefix}/pass@{self.k}": self.pass_at_k,
            f"{prefix}/pass_rate": self.pass_rate,
            f"{prefix}/errored_rollouts": float(len(self.errors)),
            f"{prefix}/reissued_rollouts": float(self.reissued),
            f"{prefix}/num_examples": float(self.num_examples),
            f"{prefix}/time_s": self.seconds,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env, "k": self.k, "pass_threshold": self.pass_threshold,
            "num_examples": self.num_examples, "avg_at_k": self.avg_at_k,
            "pass_at_k": self.pass_at_k, "pass_rate": self.pass_rate,
            "errors": self.errors, "reissued": self.reissued, "seconds": self.seconds, "rewards": self.rewards,
        }


def _openai_message(message: Any) -> dict:
    """A verifiers message in the OpenAI chat format that chat templates and `rlkube sft` read."""
    row = message.model_dump(exclude_none=True, exclude={"tool_calls", "provider_state"})
    if getattr(message, "tool_calls", None):
        row["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.tool_calls
        ]
    return row


def _openai_tool(tool: Any) -> dict:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def chat_rows(traces: list, example: str) -> list[dict]:
    """An episode's trainable message paths as `rlkube sft` rows: `messages`, `tools` (a JSON
    string, so that files with and without tools load alike) and the path's `reward`."""
    return [
        {
            "example": example, "reward": trace.reward,
            "messages": [_openai_message(m) for m in branch.messages],
            "tools": json.dumps([_openai_tool(t) for t in branch.tools]),
        }
        for trace in traces if trace.agent.trainable
        for branch in trace.branches if branch.trainable
    ]


@dataclass
class _Scored:
    reward: float
    error: str | None
    rows: list[dict]
    reissues: int = 0


Place = Callable[[str, Any, Callable[[Any], Awaitable[_Scored]]], Awaitable[_Scored]]
"""`place(env_name, task, score)`: awaits `score(ctx)` with the `ModelContext` of the replica
the task's rollout runs on, and returns what it scored."""


def on_context(context) -> Place:
    """Each rollout once, on `context`'s server (`rlkube eval`: nothing would bring a lost
    server back)."""

    async def place(env_name: str, task: Any, score) -> _Scored:
        return await score(context)

    return place


def on_pool(pool, sampling: SamplingConfig, timeout_s: float) -> Place:
    """Each rollout where the orchestrator's `pool` routes its task (the sticky replica, or a
    healthy one while that is down), requesting the model the pool requests, with the eval's
    `sampling`. A rollout that lost its replica is run again as training's are (`Reissuer`):
    the first time at once, later ones `client.resync_interval_s` apart, while the pool's watch
    brings the replicas back on the policy."""
    from rlkube.orchestrator.inference import model_contexts
    from rlkube.orchestrator.rollouts import lost_on

    contexts: dict[tuple[str, str], Any] = {}

    def context(model: str, replica: str):
        if (model, replica) not in contexts:
            contexts[model, replica] = model_contexts([replica], model, pool.renderer_model, sampling, timeout_s)[0]
        return contexts[model, replica]

    async def place(env_name: str, task: Any, score) -> _Scored:
        for attempt in itertools.count():
            if attempt > 1:
                await asyncio.sleep(pool.config.resync_interval_s)
            replica, started = pool.replica_for(env_name, str(task.key)), time.monotonic()
            scored = await pool.call_on(replica, score(context(pool.request_model, replica)))
            if scored is not None and not lost_on(pool, replica, started, scored.error):
                scored.reissues = attempt
                return scored
            pool.mark_down(replica)

    return place


async def _score(env: Any, task: Any, ctx: Any, keep_samples: bool) -> _Scored:
    """Mean trace reward of one episode; a failed episode scores 0, reports its error and
    keeps no samples."""
    try:
        episode = await env.run_episode(task, ctx)
    except Exception as e:  # noqa: BLE001 - a failed rollout is a result, not a crash
        return _Scored(0.0, f"{type(e).__name__}: {e}", [])
    traces = episode.traces
    if not episode.ok:
        errors = list(episode.errors) + [e for t in traces for e in t.errors]
        return _Scored(0.0, f"{errors[-1].type}: {errors[-1].message}" if errors else "episode failed", [])
    reward = sum(t.reward for t in traces) / len(traces) if traces else 0.0
    return _Scored(reward, None, chat_rows(traces, str(task.key)) if keep_samples else [])


async def evaluate_env(
    name: str, env: Any, place: Place, *, num_examples: int | None, rollouts_per_example: int,
    pass_threshold: float, max_concurrent: int = 64, keep_samples: bool = False,
) -> EvalResult:
    """k rollouts of each of the first `num_examples` tasks of `env` (an environment already
    inside `env.serving()`), each run where `place` puts it."""
    taskset = env.taskset
    if not taskset.bounded:
        raise ValueError(f"eval env '{name}': its taskset is infinite; bound it with num_examples in its args")
    tasks = list(taskset)[:num_examples]
    slots = asyncio.Semaphore(max_concurrent)

    async def one(task: Any) -> _Scored:
        async with slots:
            return await place(name, task, lambda ctx: _score(env, task, ctx, keep_samples))

    start = time.perf_counter()
    scored = await asyncio.gather(*(one(t) for t in tasks for _ in range(rollouts_per_example)))
    result = EvalResult(name, rollouts_per_example, pass_threshold, seconds=time.perf_counter() - start)
    for i in range(len(tasks)):
        group = scored[i * rollouts_per_example : (i + 1) * rollouts_per_example]
        result.rewards.append([s.reward for s in group])
        result.errors += [s.error for s in group if s.error]
        result.reissued += sum(s.reissues > 0 for s in group)
        result.samples += [row for s in group for row in s.rows]
    if result.errors:
        logger.warning("eval %s: %d of %d rollouts failed, e.g. %s", name, len(result.errors), len(scored), result.errors[0])
    if result.reissued:
        logger.warning("eval %s: %d rollout(s) lost their inference replica and ran again", name, result.reissued)
    return result


async def evaluate(
    envs: list[EnvConfig], place: Place, *, num_examples: int | None, rollouts_per_example: int,
    pass_threshold: float = 1.0, max_concurrent: int = 64, loaded_envs: dict[str, Any] | None = None,
    keep_samples: bool = False,
) -> list[EvalResult]:
    """Evaluate each environment of `envs`, its rollouts run where `place` puts them.
    `loaded_envs` (name -> env) reuses environments built earlier (periodic eval)."""
    from rlkube.envs import load_env
    from rlkube.envs.in_process import serving

    results = []
    for env_config in envs:
        name = env_config.name or env_config.id
        env = (loaded_envs or {}).get(name) or load_env(env_config)
        async with serving(env, env_config.rollout_path, name):
            results.append(await evaluate_env(
                name, env, place, num_examples=num_examples,
                rollouts_per_example=rollouts_per_example, pass_threshold=pass_threshold,
                max_concurrent=max_concurrent, keep_samples=keep_samples,
            ))
    return results


EVAL_REWARD = "eval/reward"
"""The metric of a periodic eval's reward: the mean of its environments' avg@k (the orchestrator's
`/status` `eval_reward`, the RLRun's `status.evalReward`)."""


def periodic_eval(config, pool, judge=None) -> Any:
    """The orchestrator's `evaluate(step) -> metrics` for `config.eval` (an OrchestratorConfig);
    environments are built once, their judges pointed at `judge` (a `JudgeEndpoint`) when given. Rollouts run on the replicas of the orchestrator's `pool`
    (`on_pool`) and request the model it requests (`InferencePool.request_model`: a LoRA
    run's adapter once a policy is served as one)."""
    from rlkube.envs import load_env

    eval_config = config.eval
    loaded = {(e.name or e.id): load_env(e, judge.target if judge else None) for e in eval_config.envs}
    place = on_pool(pool, eval_config.sampling, config.client.timeout_s)

    async def run(step: int) -> dict[str, float]:
        results = await evaluate(
            eval_config.envs, place, num_examples=eval_config.num_examples,
            rollouts_per_example=eval_config.rollouts_per_example, pass_threshold=eval_config.pass_threshold,
            max_concurrent=config.client.max_concurrent, loaded_envs=loaded,
        )
        logger.info("eval at step %d: %s", step, {r.env: round(r.avg_at_k, 4) for r in results})
        mean = sum(r.avg_at_k for r in results) / len(results)
        return {k: v for r in results for k, v in r.metrics().items()} | {EVAL_REWARD: mean}

    return run
