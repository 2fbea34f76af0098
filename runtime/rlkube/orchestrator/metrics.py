"""The orchestrator's per-step numbers, named as users of prime-rl-style trainers expect."""

import statistics
from collections import defaultdict

from rlkube.histogram import merged
from rlkube.orchestrator.types import Batch
from rlkube.rollout_types import Rollout


def _means(prefix: str, rollouts: list[Rollout], value) -> dict[str, float]:
    by_env: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        by_env[r.env].append(float(value(r)))
    out = {f"{prefix}/all/mean": statistics.fmean(v for vs in by_env.values() for v in vs)} if rollouts else {}
    out.update({f"{prefix}/{env}/mean": statistics.fmean(vs) for env, vs in by_env.items()})
    return out


ROLLOUT_HISTOGRAMS = ("rollout/latency_s", "tool/latency_s")
"""Histograms each rollout carries in its metrics (one rollout's counts), added up per batch."""
ROLLOUT_COUNTS = ("tool/calls", "tool/timeouts", "tool/errors", "tool/retries")
"""Counts each rollout may carry, summed per batch."""


def rollout_metrics(rollouts: list[Rollout]) -> dict[str, float]:
    """The batch's rollout and tool-call histograms and tool-call counts (where any rollout has them)."""
    out: dict[str, float] = {}
    for name in ROLLOUT_HISTOGRAMS:
        if any(f"{name}/count" in r.metrics for r in rollouts):
            out |= merged(name, (r.metrics for r in rollouts)).summary()
    for name in ROLLOUT_COUNTS:
        if any(name in r.metrics for r in rollouts):
            out[name] = sum(r.metrics.get(name, 0.0) for r in rollouts)
    return out


def batch_metrics(batch: Batch, filter_zero_advantage: bool) -> dict[str, float]:
    rollouts = batch.rollouts
    trainable = [r for r in rollouts if r.trainable]
    samples = [s for r in trainable for s in r.samples]
    kept = batch.samples(filter_zero_advantage)
    metrics = dict(batch.metrics)
    metrics.update(_means("reward", rollouts, lambda r: r.reward))
    metrics.update(_means("seq_len", trainable, lambda r: r.seq_len))
    metrics.update(_means("completion_len", trainable, lambda r: r.completion_tokens))
    metrics.update(_means("is_truncated", trainable, lambda r: r.is_truncated))
    metrics.update(_means("num_turns", trainable, lambda r: r.num_turns))
    metrics.update(rollout_metrics(rollouts))
    metrics.update(
        {
            "rollouts": float(len(rollouts)),
            "errored_rollouts": float(sum(r.error is not None for r in rollouts)),
            "empty_rollouts": float(sum(r.error is None and r.is_empty for r in rollouts)),
            "samples/trained": float(len(kept)),
            "samples/zero_advantage_filtered": float(len(samples) - len(kept)),
            "tokens/loss": float(sum(s.num_loss_tokens for s in kept)),
        }
    )
    return metrics


TRUNCATED_WARN_FRACTION = 0.5


def truncation_warning(metrics: dict[str, float], max_tokens: int) -> str | None:
    """What to tell a user whose batch was mostly cut off at `sampling.max_tokens`, or None.

    Such a run scores, and learns, only the part of each answer that fits. And the budget is
    shared with the chat template's format tokens (Qwen3's empty think block takes 6): one policy
    update that makes an extra format token likely takes room from every answer of the next
    batches. The reverse-text cluster scenario ran that way (8 tokens, 97-100 % truncated) and
    its reward dipped to ~0 for two steps once in four runs."""
    truncated = metrics.get("is_truncated/all/mean", 0.0)
    if truncated < TRUNCATED_WARN_FRACTION:
        return None
    return (f"{truncated:.0%} of the batch's completions were cut at orchestrator.sampling.max_tokens = {max_tokens}: "
            "the reward scores only what fits, and a format token the policy learns to add takes room from every "
            "answer; raise max_tokens above the longest answer plus the chat template's tokens")
