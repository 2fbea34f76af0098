"""Keep inference busy within the policy clock's limits; turn finished groups into batches.

One loop: launch whole groups (`group_size` rollouts of one task, the env picked by `ratio`)
while the clock allows more rollouts than are in flight or buffered, wait for any group to
finish, score it (advantages), buffer it, and cut batches from the buffer in step order. When
the clock allows nothing and nothing is in flight, inference is idle waiting for the trainer:
that time is reported as `time/wait_for_ckpt`.

Over-provisioning (`over_provision`): a group still in flight after a batch's worth of
rollouts launched after it have finished is a straggler. Stragglers keep running, but up to
`(over_provision - 1)` times the clock's budget of them no longer hold that budget, so new
groups start in their place and the next batches are cut from the first groups to finish. A
straggler that finishes joins a later batch, or is dropped there by the staleness bound
(`off_policy/dropped_*`). Sync mode (`async_level = 0`) has no over-provisioning: a
straggler running on while the trainer trains would be the overlap itself.
"""

import asyncio
import itertools
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable

from rlkube.orchestrator.advantage import AdvantageFn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.types import Batch
from rlkube.rollout_types import Rollout

logger = logging.getLogger(__name__)

RunGroup = Callable[[object, str, object, int], Awaitable[list[Rollout]]]
"""(env runner, example id, task, rollouts) -> that many scored rollouts of the task."""


def score_group(group: list[Rollout], advantage_fn: AdvantageFn) -> list[Rollout]:
    """Advantages within the group, over its trainable rollouts only (errored and empty ones
    are neither a baseline nor trained on)."""
    valid = [r for r in group if r.trainable]
    if valid:
        advantages = advantage_fn([r.reward for r in valid], [r.completion_tokens for r in valid])
        for rollout, advantage in zip(valid, advantages):
            rollout.advantage = float(advantage)
            for sample in rollout.samples:
                sample.advantage = float(advantage)
    return group


class Scheduler:
    def __init__(
        self,
        runners: list,
        ratios: list[float],
        run_group: RunGroup,
        clock: PolicyClock,
        buffer: RolloutBuffer,
        advantage_fn: AdvantageFn,
        group_size: int,
        max_steps: int,
        max_groups_in_flight: int,
        on_batch: Callable[[Batch], None],
        seed: int = 0,
        next_step: int = 1,
        over_provision: float = 1.0,
    ):
        self.runners, self.ratios = runners, ratios
        self.run_group = run_group
        self.clock, self.buffer = clock, buffer
        self.advantage_fn = advantage_fn
        self.group_size, self.max_steps = group_size, max_steps
        self.max_groups_in_flight = max_groups_in_flight
        self.on_batch = on_batch
        self.rng = random.Random(seed)
        self.next_step = next_step
        self.over_provision = over_provision if clock.async_level > 0 else 1.0
        self.in_flight: dict[asyncio.Task, tuple[object, str]] = {}
        """Each group in flight, with its (runner, example id)."""
        self.launch_order = itertools.count()
        self.launched: dict[asyncio.Task, int] = {}
        """Each group in flight, with its place in the launch order."""
        self.overtaken: dict[asyncio.Task, int] = {}
        """Each group in flight, with the rollouts launched after it that have finished."""
        self.waited_s = 0.0

    def allowed_rollouts(self) -> int:
        """Rollouts the clock lets exist (in flight or buffered) for batches not yet cut."""
        newest = min(self.clock.newest_batch(), self.max_steps)
        return max(0, newest - (self.next_step - 1)) * self.buffer.batch_size

    def straggler_rollouts(self) -> int:
        """Rollouts in flight in groups that a batch's worth of later rollouts overtook."""
        return self.group_size * sum(n >= self.buffer.batch_size for n in self.overtaken.values())

    def outstanding_rollouts(self) -> int:
        """Rollouts that hold the clock's budget: in flight or buffered, less the stragglers
        that over-provisioning lets run beside it."""
        free = math.floor((self.over_provision - 1) * self.allowed_rollouts())
        held = len(self.in_flight) * self.group_size - min(self.straggler_rollouts(), free)
        return held + self.buffer.fresh_rollouts(self.next_step)

    def _launch(self) -> None:
        while len(self.in_flight) < self.max_groups_in_flight and (
            self.outstanding_rollouts() < self.allowed_rollouts()
            # the next batch has its rollouts but too few samples: one more group at a time
            or (not self.in_flight and self.buffer.short_of_samples(self.next_step))
        ):
            runner = self.rng.choices(self.runners, weights=self.ratios)[0]
            example_id, task = runner.next_task()
            group = asyncio.ensure_future(self.run_group(runner, example_id, task, self.group_size))
            self.in_flight[group] = (runner, example_id)
            self.launched[group], self.overtaken[group] = next(self.launch_order), 0

    def _finished(self, group_task: asyncio.Task) -> None:
        """Counts the finished group against every group in flight that was launched before it."""
        order = self.launched.pop(group_task)
        del self.overtaken[group_task]
        for task, launched in self.launched.items():
            if launched < order:
                self.overtaken[task] += self.group_size

    @staticmethod
    def _record(runner, example_id: str, group: list[Rollout]) -> None:
        """The group's rewards to its env's task sampler (difficulty labels), over the rollouts
        that count (an errored or lost one says nothing about the task)."""
        if rewards := [r.reward for r in group if r.trainable]:
            runner.record(example_id, rewards)

    def _cut_batches(self) -> None:
        while self.next_step <= self.max_steps and (batch := self.buffer.take_batch(self.next_step)):
            batch.metrics["time/wait_for_ckpt"] = self.waited_s
            self.waited_s = 0.0
            self.on_batch(batch)
            self.next_step += 1

    async def run(self) -> None:
        """Until batch `max_steps` is cut. Cancelling it cancels the rollouts in flight."""
        try:
            while self.next_step <= self.max_steps:
                self._launch()
                clock_changed = asyncio.ensure_future(self.clock.wait_change())
                idle_since = time.perf_counter() if not self.in_flight else None
                done, _ = await asyncio.wait({*self.in_flight, clock_changed}, return_when=asyncio.FIRST_COMPLETED)
                clock_changed.cancel()
                if idle_since is not None:
                    self.waited_s += time.perf_counter() - idle_since
                for task in done - {clock_changed}:
                    group = score_group(task.result(), self.advantage_fn)
                    self._finished(task)
                    self._record(*self.in_flight.pop(task), group)
                    self.buffer.add_group(group)
                self._cut_batches()
        finally:
            for task in self.in_flight:
                task.cancel()
            await asyncio.gather(*self.in_flight, return_exceptions=True)
            self.in_flight.clear()
            self.launched.clear()
            self.overtaken.clear()

    def state_dict(self) -> dict:
        rng_state = self.rng.getstate()
        return {"next_step": self.next_step, "rng": [rng_state[0], list(rng_state[1]), rng_state[2]]}

    def load_state_dict(self, state: dict) -> None:
        self.next_step = state["next_step"]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
