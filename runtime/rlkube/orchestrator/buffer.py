"""Finished groups wait here until a batch takes them; stale rollouts are dropped on the way.

Groups are kept whole and in completion order. `take_batch(n)` pops groups until it has
`batch_size` rollouts that are fresh enough for step `n` (see clock.py) and at least
`min_samples` samples to train on (`orchestrator.min_batch_samples`: a batch of errored, empty or
zero-advantage rollouts waits for more groups instead of becoming a step on nothing); what it
does not need stays for the next step, so no finished work is lost (and the buffer is
checkpointed).
A rollout's lag counts from the oldest policy that sampled it: the clock's, or the engine's own
report where the rollout path sees it (`Rollout.oldest_policy`). A token's lag counts from the
policy that sampled it (`Sample.policy_versions`; the rollout's oldest where not recorded).
`drop` (`orchestrator.off_policy_drop`) says what the bound drops: a rollout with any token past
it (`rollout`), or only the tokens past it (`token`: they leave the loss; a rollout with none
left is dropped). Each batch reports the dropped rollouts and tokens and the lag of every token
it trains (`off_policy/token_lag`, a histogram: rlkube.histogram).
"""

from collections import deque
from typing import Literal

from rlkube.histogram import Histogram
from rlkube.orchestrator.clock import off_policy_lag
from rlkube.orchestrator.types import Batch
from rlkube.rollout_types import Rollout

OffPolicyDrop = Literal["rollout", "token"]


def token_lags(rollout: Rollout, batch_step: int) -> list[list[int]]:
    """Per sample, the off-policy lag of each of its sampled tokens at `batch_step`."""
    return [[off_policy_lag(batch_step, v) for v in s.token_versions(rollout.oldest_policy)] for s in rollout.samples]


class RolloutBuffer:
    def __init__(self, batch_size: int, max_off_policy_steps: int, min_samples: int = 1,
                 drops_zero_advantage: bool = False, drop: OffPolicyDrop = "rollout"):
        self.batch_size = batch_size
        self.max_off_policy_steps, self.drop = max_off_policy_steps, drop
        self.min_samples, self.drops_zero_advantage = min_samples, drops_zero_advantage
        self.groups: deque[list[Rollout]] = deque()
        self.dropped_total = 0

    def add_group(self, group: list[Rollout]) -> None:
        self.groups.append(group)

    def num_rollouts(self) -> int:
        return sum(len(g) for g in self.groups)

    def fresh_rollouts(self, batch_step: int) -> int:
        return sum(self._is_fresh(r, batch_step) for g in self.groups for r in g)

    def _is_fresh(self, rollout: Rollout, batch_step: int) -> bool:
        """Whether batch `batch_step` takes it: its oldest token within the bound, or with
        `drop = "token"` its newest (a rollout with no sampled tokens: its oldest policy)."""
        lags = [lag for sample in token_lags(rollout, batch_step) for lag in sample]
        if self.drop == "token" and lags:
            return min(lags) <= self.max_off_policy_steps
        return off_policy_lag(batch_step, rollout.oldest_policy) <= self.max_off_policy_steps

    def _drop_stale_tokens(self, rollout: Rollout, batch_step: int) -> int:
        """Take the sampled tokens past the bound out of the loss (`drop = "token"`), and the
        samples left with none; returns how many tokens."""
        dropped = 0
        for sample, lags in zip(rollout.samples, token_lags(rollout, batch_step)):
            stale = iter(lag > self.max_off_policy_steps for lag in lags)
            sample.loss_mask = [m and not next(stale) for m in sample.loss_mask]
            dropped += sum(lag > self.max_off_policy_steps for lag in lags)
        rollout.samples = [s for s in rollout.samples if s.num_loss_tokens]
        return dropped

    def _trained_token_lags(self, rollouts: list[Rollout], batch_step: int) -> Histogram:
        lags = Histogram("off_policy/token_lag")
        for rollout in rollouts:
            if not rollout.trainable:
                continue
            for sample, sample_lags in zip(rollout.samples, token_lags(rollout, batch_step)):
                if not (self.drops_zero_advantage and sample.advantage == 0.0):
                    for lag in sample_lags:
                        lags.add(lag)
        return lags

    def groups_for_batch(self, step: int) -> int | None:
        """How many groups from the front make batch `step`: `batch_size` fresh rollouts with
        at least `min_samples` samples to train on; None while the buffer holds too few.
        RuntimeError when `batch_size` of them are all errored (inference down for good, or a
        broken env): the run fails loudly instead of waiting for ever."""
        rollouts = samples = 0
        errors: list[str] = []
        for taken, group in enumerate(self.groups, 1):
            fresh = [r for r in group if self._is_fresh(r, step)]
            rollouts += len(fresh)
            samples += len(Batch(step, fresh).samples(self.drops_zero_advantage))
            errors += [r.error for r in fresh if r.error is not None]
            if rollouts >= self.batch_size and samples >= self.min_samples:
                return taken
            if rollouts >= self.batch_size and len(errors) == rollouts:
                raise RuntimeError(f"all {rollouts} rollouts of batch {step} failed, e.g. {errors[0]}")
        return None

    def short_of_samples(self, step: int) -> bool:
        """Whether `batch_size` fresh rollouts are buffered but too few samples to train on:
        batch `step` needs more groups than the clock counts on."""
        return self.fresh_rollouts(step) >= self.batch_size and self.groups_for_batch(step) is None

    def take_batch(self, step: int) -> Batch | None:
        """Batch `step`, or None (taking nothing) while `groups_for_batch` finds too few. A
        group is taken whole; the batch may overshoot `batch_size` by less than a group when
        stale rollouts were dropped from it, and by more when it waited for samples."""
        taken = self.groups_for_batch(step)
        if taken is None:
            return None
        rollouts: list[Rollout] = []
        dropped = dropped_tokens = behind_clock = 0
        for _ in range(taken):
            group = self.groups.popleft()
            fresh = [r for r in group if self._is_fresh(r, step)]
            dropped += len(group) - len(fresh)
            dropped_tokens += sum(r.completion_tokens for r in group if r.trainable and r not in fresh)
            if self.drop == "token":
                dropped_tokens += sum(self._drop_stale_tokens(r, step) for r in fresh if r.trainable)
            behind_clock += sum(r.served_min is not None and r.served_min < r.policy_min for r in group)
            rollouts.extend(fresh)
        self.dropped_total += dropped
        lags = [off_policy_lag(step, r.oldest_policy) for r in rollouts]
        metrics = {
            **self._trained_token_lags(rollouts, step).summary(),
            "off_policy/dropped_rollouts": float(dropped),
            "off_policy/dropped_tokens": float(dropped_tokens),
            "off_policy/lag/mean": sum(lags) / len(lags),
            "off_policy/lag/max": float(max(lags)),
        }
        if served := [r.served_min for r in rollouts if r.served_min is not None]:
            metrics["off_policy/served_lag/max"] = float(max(off_policy_lag(step, v) for v in served))
            metrics["off_policy/served_rollouts"] = float(len(served))
            # sampled by older weights than the clock said were served: a replica that lost them
            metrics["off_policy/served_behind_clock"] = float(behind_clock)
        return Batch(step=step, rollouts=rollouts, metrics=metrics)

    def state_dict(self) -> dict:
        return {"groups": [[r.to_dict() for r in g] for g in self.groups], "dropped_total": self.dropped_total}

    def load_state_dict(self, state: dict) -> None:
        self.groups = deque([Rollout.from_dict(r) for r in g] for g in state["groups"])
        self.dropped_total = state["dropped_total"]
