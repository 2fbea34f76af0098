"""Over-provisioning within the staleness bound (`orchestrator.over_provision`).

Fake groups that finish when the test says so, no timing: a batch is cut from the groups
that finished while stragglers are still in flight, and a straggler that finishes late is
trained only on the tokens within the bound."""

import asyncio
import itertools

import pytest
from rlkube.config import AdvantageConfig, OrchestratorConfig
from rlkube.orchestrator.advantage import make_advantage_fn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.scheduler import Scheduler
from rlkube.rollout_types import Rollout, Sample

from tests.orchestrator.test_clock_buffer import FakeRunner

BATCH, GROUP = 4, 2
STRAGGLERS = {0, 1}
"""Launch order of the groups that run until released: the first two (one batch's worth)."""


class Groups:
    """Groups that finish at once, except the stragglers, which wait for `release`. Each
    rollout is three turns of two tokens: the first on the policy it started on, the last on
    the one it ended on, the middle one on the policy before that (or the first's)."""

    def __init__(self, clock: PolicyClock):
        self.clock, self.order, self.release = clock, itertools.count(), asyncio.Event()

    async def run_group(self, runner, example_id, task, size):
        started = self.clock.policy_step
        if next(self.order) in STRAGGLERS:
            await self.release.wait()
        await asyncio.sleep(0)
        ended = self.clock.policy_step
        return [self.rollout(float(i % 2), started, ended, example_id) for i in range(size)]

    @staticmethod
    def rollout(reward: float, started: int, ended: int, example_id: str) -> Rollout:
        middle = max(started, ended - 1)
        sample = Sample(list(range(8)), [False, False] + [True] * 6, [0.0, 0.0] + [-0.5] * 6, 1.0,
                        policy_versions=[-1, -1, started, started, middle, middle, ended, ended])
        return Rollout("fake", example_id, reward, [sample], started, ended)


def scheduler(clock, groups, batches, over_provision, max_steps=8, max_off_policy_steps=1):
    buffer = RolloutBuffer(BATCH, max_off_policy_steps, drop="token")
    return Scheduler([FakeRunner()], [1.0], groups.run_group, clock, buffer, make_advantage_fn(AdvantageConfig(), 10),
                     GROUP, max_steps, max_groups_in_flight=16, on_batch=batches.append, over_provision=over_provision)


async def settle():
    """Let every task that can run, run (no clock: event-loop turns)."""
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.mark.parametrize("over_provision", [1.0, 2.0])
def test_a_batch_is_cut_while_stragglers_are_in_flight(over_provision):
    async def go():
        clock, batches = PolicyClock(async_level=1), []
        groups = Groups(clock)
        loop = scheduler(clock, groups, batches, over_provision)
        running = asyncio.ensure_future(loop.run())
        await settle()  # the clock allows two batches: four groups; the two stragglers hold one
        cut, in_flight, stragglers = [b.step for b in batches], len(loop.in_flight), loop.straggler_rollouts()
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        return cut, in_flight, stragglers

    cut, in_flight, stragglers = asyncio.run(go())
    assert stragglers == 2 * GROUP, "both slow groups were overtaken by a batch's worth of rollouts"
    if over_provision == 1.0:
        assert cut == [1] and in_flight == 2, "batch 2 waits for the stragglers"
    else:
        assert cut == [1, 2] and in_flight == 2, "batch 2 is cut from groups started in the stragglers' place"


def test_sync_mode_ignores_over_provisioning():
    clock, batches = PolicyClock(async_level=0), []
    assert scheduler(clock, Groups(clock), batches, over_provision=4.0).over_provision == 1.0


def test_a_late_straggler_trains_only_its_tokens_within_the_bound():
    async def go():
        clock, batches = PolicyClock(async_level=1), []
        groups = Groups(clock)
        running = asyncio.ensure_future(scheduler(clock, groups, batches, over_provision=2.0).run())
        for step in range(1, 9):
            while len(batches) < step:
                await settle()
            if step == 3:
                groups.release.set()  # the stragglers (policy 0) finish on policy 3
            clock.advance(step)
        await running
        return batches

    batches = asyncio.run(go())
    late = [(b, r) for b in batches for r in b.rollouts if r.policy_min == 0 and r.policy_max > 0]
    assert len(late) == 2 * GROUP, "the stragglers' rollouts joined a later batch"
    (batch,) = {id(b): b for b, _ in late}.values()
    for _, rollout in late:
        (sample,) = rollout.samples
        lags = [batch.step - 1 - v for v in sample.policy_versions[2::2]]
        assert lags[0] > 1 and lags[1:] == [1, 0], "turns past, at and within the bound (1)"
        assert sample.loss_mask == [False, False, False, False, True, True, True, True], "only the first turn left"
    assert batch.metrics["off_policy/dropped_tokens"] == 2 * len(late)
    assert all(b.metrics["off_policy/dropped_tokens"] == 0 for b in batches if b is not batch)


def test_the_default_over_provisions_async_runs():
    assert OrchestratorConfig().over_provision == 2.0
