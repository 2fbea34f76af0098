"""Group advantages: each rollout's reward against the mean of its group.

Default is Dr. GRPO: `A_i = r_i - mean(r)`, no std normalization, so groups whose rollouts
all succeed or all fail get zero advantage (and are filtered out later: they teach nothing).
Options: divide by the group's reward std (GRPO), subtract a length penalty from each reward
before the baseline, or replace the whole function by an import path.
"""

import statistics
from collections.abc import Callable

from rlkube.config import AdvantageConfig
from rlkube.plugins import import_callable

AdvantageFn = Callable[[list[float], list[int]], list[float]]
"""(rewards, completion_tokens) of one group -> one advantage per rollout."""

STD_EPS = 1e-6


def group_advantages(
    rewards: list[float], completion_tokens: list[int], std_normalize: bool, length_penalty: float, max_tokens: int
) -> list[float]:
    shaped = [r - length_penalty * n / max_tokens for r, n in zip(rewards, completion_tokens)]
    baseline = statistics.fmean(shaped)
    advantages = [r - baseline for r in shaped]
    if std_normalize:
        std = statistics.pstdev(shaped)
        advantages = [a / (std + STD_EPS) for a in advantages]
    return advantages


def make_advantage_fn(config: AdvantageConfig, max_tokens: int) -> AdvantageFn:
    """Resolve the configured advantage function once, at setup."""
    if config.custom:
        return import_callable(config.custom, "advantage.custom")

    def default(rewards: list[float], completion_tokens: list[int]) -> list[float]:
        return group_advantages(rewards, completion_tokens, config.std_normalize, config.length_penalty, max_tokens)

    return default
