"""The orchestrator's per-step numbers, named as users of prime-rl-style trainers expect."""

import statistics
from collections import defaultdict

from rlkube.orchestrator.types import Batch
from rlkube.rollout_types import Rollout


def _means(prefix: str, rollouts: list[Rollout], value) -> dict[str, float]:
    by_env: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        by_env[r.env].append(float(value(r)))
    out = {f"{prefix}/all/mean": statistics.fmean(v for vs in by_env.values() for v in vs)} if rollouts else {}
    out.update({f"{prefix}/{env}/mean": statistics.fmean(vs) for env, vs in by_env.items()})
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
