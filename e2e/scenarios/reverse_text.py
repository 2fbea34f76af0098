"""The reverse-text scenario's RL part, shared by the cluster scenario (test_reverse_text.py)
and by `python -m e2e.scenarios.reverse_text_runs`, which runs it with `rlkube rl` on this
machine many times over: the configuration, and the rise of the training reward it must show."""

import math
import os
import statistics
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass

SFT_STEPS = 80
RL_STEPS = 36
MIN_TREND_T = 2.0
"""The training reward must rise over the run: the least-squares slope of the per-step reward
at least this many standard errors above zero. A reversed advantage sign makes it fall, a
trainer that does not learn leaves it at zero (t >= 2 by chance in ~2 % of such runs, whose
per-step rewards are independent draws). It replaces a bound of 0.03 on the rise from the first
third of the steps to the last, set when the reward scored only two characters of each answer
and rose +0.08 to +0.14 in 24 steps.
Measured with `python -m e2e.scenarios.reverse_text_runs` on a 2-core VM, RL_CONFIG: scoring
whole answers, 24 steps rose too little and too unevenly for either check (thirds +0.015 to
+0.074 and t = 1.6 to 6.9 over 13 runs: 2 under the old bound, 1 under t = 2); 36 steps give
t = 4.2 to 7.5 (8 runs, thirds +0.033 to +0.099); with the advantage's sign flipped the reward
fell from 0.24 to 0.00 by step 9 (t = -6.7)."""
# A short RL with a visible learning signal on two cores: short strings (2-4 characters), 128
# rollouts a step at temperature 0.7, a constant 2.5e-4 after 3 warm-up steps, from the 80-step
# SFT warm-up. 16 new tokens: the model opens each answer with the template's empty think block
# (6 tokens), and the answer and its end take up to 5 more. With 8, as this scenario had, 93-100 %
# of the completions were cut after two characters: the reward scored those alone, and one
# update that made an extra format token likely (a second newline) cut the next batches'
# answers to one character or none (reward 0.30 -> 0.01 for two steps, once in four runs).
# docs/training.md says more; `python -m e2e.scenarios.reverse_text_runs` measures this config.
RL_CONFIG = {
    "orchestrator.batch_size": 128, "orchestrator.sampling.temperature": 0.7,
    "orchestrator.sampling.max_tokens": 16,
    "orchestrator.envs": [{"id": "reverse_text", "args": {"min_len": 2, "max_len": 4}}],
    "trainer.optim": {"lr": 2.5e-4, "max_grad_norm": 1.0},
    "trainer.scheduler": {"type": "constant", "warmup_steps": 3},
}

RL_SET_ENV = "RLKUBE_E2E_RL_SET"
"""The cluster scenario's overrides of RL_CONFIG, one `KEY=VALUE` a line as
`reverse_text_runs --set` takes them, e.g. `weights.type="nixl"` or
`weights.delta={full_every=10}`: the same scenario with another setting, on the cluster."""


def overrides(items: Iterable[str]) -> dict:
    """`KEY=VALUE` items (a dotted config key, a TOML value) as `short_rl`'s config overrides."""
    pairs = (item.split("=", 1) for item in items if item.strip())
    return {key.strip(): tomllib.loads(f"v = {value}")["v"] for key, value in pairs}


def env_overrides() -> dict:
    """The overrides `RLKUBE_E2E_RL_SET` names (none when unset)."""
    return overrides(os.environ.get(RL_SET_ENV, "").splitlines())


def weight_updates(orchestrator_metrics: list[dict], trainer_metrics: list[dict]) -> str:
    """A run's policy updates, medians over its steps: the bytes each publish sent
    (`weights/bytes`: a delta's, or the whole policy's), the trainer's background publish and
    the replicas' load (`time/update_weights`)."""
    def median(records: list[dict], key: str) -> float:
        values = [r[key] for r in records if key in r]
        return statistics.median(values) if values else math.nan

    sent = [r["weights/bytes"] for r in trainer_metrics if "weights/bytes" in r]
    return (f"weight updates: {median(trainer_metrics, 'weights/bytes') / 1e6:.2f} MB sent a step "
            f"({min(sent, default=math.nan) / 1e6:.2f}-{max(sent, default=math.nan) / 1e6:.2f}), publish "
            f"{median(trainer_metrics, 'time/publish_background'):.3f} s, load "
            f"{median(orchestrator_metrics, 'time/update_weights'):.3f} s (medians)")


@dataclass
class Rise:
    """The training reward of a run step by step, and whether it rose as it must."""

    rewards: dict[int, float]
    mismatch_kl: dict[int, float]

    @property
    def thirds(self) -> tuple[float, float, float]:
        """The mean reward of the first, middle and last third of the steps."""
        third = len(self.rewards) // 3
        steps = sorted(self.rewards)
        return tuple(statistics.fmean(self.rewards[s] for s in steps[i * third:(i + 1) * third]) for i in range(3))

    @property
    def trend(self) -> tuple[float, float]:
        """(slope of the reward per step by least squares, its t statistic: slope / standard
        error, from the residuals around the fitted line)."""
        steps = sorted(self.rewards)
        rewards = [self.rewards[s] for s in steps]
        slope, intercept = statistics.linear_regression(steps, rewards)
        residuals = [r - (intercept + slope * s) for s, r in zip(steps, rewards, strict=True)]
        mean_step = statistics.fmean(steps)
        spread = sum((s - mean_step) ** 2 for s in steps)
        error = math.sqrt(sum(e * e for e in residuals) / (len(steps) - 2) / spread)
        return slope, slope / error if error else math.inf

    @property
    def rose(self) -> bool:
        return self.trend[1] >= MIN_TREND_T

    def summary(self) -> str:
        slope, t = self.trend
        first, middle, last = self.thirds
        return (f"reward by thirds {first:.3f} {middle:.3f} {last:.3f} (rise {last - first:+.3f}), "
                f"trend {slope:+.4f} a step (t = {t:.1f})")

    def explain(self) -> str:
        """What a failed rise shows: the reward of every step, and the trainer's mismatch KL by
        step (a step that knocked the policy shows there)."""
        return (f"the reward did not rise (t >= {MIN_TREND_T:g}): {self.summary()}; reward by step "
                f"{_rounded(self.rewards)}; mismatch KL by step {_rounded(self.mismatch_kl)}")

    @classmethod
    def of(cls, orchestrator_metrics: list[dict], trainer_metrics: list[dict]) -> "Rise":
        """From a run's metric records (a step logged twice, after a restart, counts once)."""
        rewards = {r["step"]: r["reward/all/mean"] for r in orchestrator_metrics if "reward/all/mean" in r}
        mismatch = {r["step"]: r["mismatch_kl/mean"] for r in trainer_metrics if "mismatch_kl/mean" in r}
        return cls(rewards, mismatch)


def _rounded(values: dict[int, float]) -> dict[int, float]:
    return {step: round(value, 3) for step, value in sorted(values.items())}
