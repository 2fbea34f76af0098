"""Finished groups wait here until a batch takes them; stale rollouts are dropped on the way.

Groups are kept whole and in completion order. `take_batch(n)` pops groups until it has
`batch_size` rollouts that are fresh enough for step `n` (see clock.py); what it does not
need stays for the next step, so no finished work is lost (and the buffer is checkpointed).
A rollout's lag counts from the oldest policy that sampled it: the clock's, or the engine's own
report where the rollout path sees it (`Rollout.oldest_policy`).
"""

from collections import deque

from rlkube.orchestrator.clock import off_policy_lag
from rlkube.orchestrator.types import Batch, Rollout


class RolloutBuffer:
    def __init__(self, batch_size: int, max_off_policy_steps: int):
        self.batch_size = batch_size
        self.max_off_policy_steps = max_off_policy_steps
        self.groups: deque[list[Rollout]] = deque()
        self.dropped_total = 0

    def add_group(self, group: list[Rollout]) -> None:
        self.groups.append(group)

    def num_rollouts(self) -> int:
        return sum(len(g) for g in self.groups)

    def fresh_rollouts(self, batch_step: int) -> int:
        return sum(self._is_fresh(r, batch_step) for g in self.groups for r in g)

    def _is_fresh(self, rollout: Rollout, batch_step: int) -> bool:
        return off_policy_lag(batch_step, rollout.oldest_policy) <= self.max_off_policy_steps

    def take_batch(self, step: int) -> Batch | None:
        """Batch `step`, or None (taking nothing) while fewer than `batch_size` fresh
        rollouts are buffered. A group is taken whole; the batch may overshoot
        `batch_size` by less than a group when stale rollouts were dropped from it."""
        if self.fresh_rollouts(step) < self.batch_size:
            return None
        rollouts: list[Rollout] = []
        dropped = behind_clock = 0
        while len(rollouts) < self.batch_size:
            group = self.groups.popleft()
            fresh = [r for r in group if self._is_fresh(r, step)]
            dropped += len(group) - len(fresh)
            behind_clock += sum(r.served_min is not None and r.served_min < r.policy_min for r in group)
            rollouts.extend(fresh)
        self.dropped_total += dropped
        lags = [off_policy_lag(step, r.oldest_policy) for r in rollouts]
        metrics = {
            "off_policy/dropped_rollouts": float(dropped),
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
