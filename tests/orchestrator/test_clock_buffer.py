"""The policy clock and the buffer: when rollouts may be generated, which ones are dropped,
and the async / sync schedule against a fake instant inference."""

import asyncio

import pytest
from rlkube.config import AdvantageConfig
from rlkube.orchestrator.advantage import make_advantage_fn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.scheduler import Scheduler

from tests.orchestrator.helpers import make_rollout


def test_clock_limits():
    sync, overlap = PolicyClock(async_level=0), PolicyClock(async_level=1)
    assert sync.may_generate(1) and not sync.may_generate(2)
    assert overlap.may_generate(2) and not overlap.may_generate(3)
    overlap.advance(3)
    assert overlap.newest_batch() == 5
    with pytest.raises(ValueError, match="older than the loaded 3"):
        overlap.advance(2)


def test_stale_rollouts_are_dropped_and_counted():
    buffer = RolloutBuffer(batch_size=4, max_off_policy_steps=2)
    # batch 6: the trainer holds policy 5; lag = 5 - policy_min; > 2 is dropped
    buffer.add_group([make_rollout(1.0, policy_min=2), make_rollout(0.0, policy_min=3)])  # lags 3, 2
    buffer.add_group([make_rollout(1.0, policy_min=5), make_rollout(0.0, policy_min=4)])
    assert buffer.take_batch(6) is None, "only 3 fresh rollouts"
    buffer.add_group([make_rollout(1.0, policy_min=5), make_rollout(0.0, policy_min=5)])
    batch = buffer.take_batch(6)
    assert [r.policy_min for r in batch.rollouts] == [3, 5, 4, 5, 5]
    assert batch.metrics["off_policy/dropped_rollouts"] == 1.0
    assert batch.metrics["off_policy/lag/max"] == 2.0
    assert buffer.dropped_total == 1 and buffer.num_rollouts() == 0


def test_rollouts_the_engine_says_came_from_old_weights_are_dropped():
    """The clock says policy 5 was served; the engine's own tags say otherwise for a replica
    that restarted on the base model ("default") or lagged: those rollouts are not trained."""
    buffer = RolloutBuffer(batch_size=2, max_off_policy_steps=1)

    def served(*versions):
        rollout = make_rollout(1.0, policy_min=5)
        rollout.served_versions = list(versions)
        return rollout

    buffer.add_group([served("default"), served("5", "3")])  # the base model; a span on policy 3
    buffer.add_group([served("5"), served("4", "5")])
    batch = buffer.take_batch(6)
    assert [r.served_versions for r in batch.rollouts] == [["5"], ["4", "5"]]
    assert batch.metrics["off_policy/dropped_rollouts"] == 2.0
    assert batch.metrics["off_policy/served_lag/max"] == 1.0 and batch.metrics["off_policy/served_rollouts"] == 2.0
    assert batch.metrics["off_policy/served_behind_clock"] == 3.0  # "default", the span on 3, and 4
    buffer.add_group([make_rollout(1.0, policy_min=6), make_rollout(1.0, policy_min=6)])
    assert "off_policy/served_lag/max" not in buffer.take_batch(7).metrics, "no engine report, no served lag"


def test_buffer_state_round_trip():
    buffer = RolloutBuffer(batch_size=2, max_off_policy_steps=1)
    buffer.add_group([make_rollout(0.25, policy_min=7, example_id="a")])
    restored = RolloutBuffer(batch_size=2, max_off_policy_steps=1)
    restored.load_state_dict(buffer.state_dict())
    assert restored.groups[0][0] == buffer.groups[0][0]


class FakeRunner:
    name = "fake"

    def __init__(self):
        self.count = 0

    def next_task(self):
        self.count += 1
        return str(self.count), None

    def record(self, example_id, rewards):
        pass


async def run_loop(async_level: int, max_steps: int = 6, batch_size: int = 4, group_size: int = 2):
    """Scheduler + instant inference + a fake trainer that trains each batch and reports."""
    clock = PolicyClock(async_level)
    batches, events = {}, []

    async def run_group(runner, example_id, task, size):
        events.append(("generate", clock.policy_step))
        await asyncio.sleep(0)
        return [make_rollout(float(i % 2), policy_min=clock.policy_step, example_id=example_id) for i in range(group_size)]

    def on_batch(batch):
        events.append(("batch", batch.step))
        batches[batch.step] = batch

    scheduler = Scheduler(
        [FakeRunner()], [1.0], run_group, clock, RolloutBuffer(batch_size, max_off_policy_steps=1),
        make_advantage_fn(AdvantageConfig(), 10), group_size, max_steps, max_groups_in_flight=8, on_batch=on_batch,
    )

    async def trainer():
        for step in range(1, max_steps + 1):
            while step not in batches:
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.01)  # "training"
            events.append(("policy", step))
            clock.advance(step)

    await asyncio.wait_for(asyncio.gather(scheduler.run(), trainer()), timeout=10)
    return batches, events


def test_synchronous_mode_trains_each_batch_on_the_previous_policy():
    batches, events = asyncio.run(run_loop(async_level=0))
    assert sorted(batches) == list(range(1, 7))
    for step, batch in batches.items():
        assert len(batch.rollouts) == 4
        assert {r.policy_min for r in batch.rollouts} == {step - 1}
    # no generation while the trainer trains: batch n is cut before policy n exists, and
    # nothing for batch n+1 is generated until policy n arrives
    for step in range(1, 6):
        cut, policy = events.index(("batch", step)), events.index(("policy", step))
        assert all(e[0] != "generate" for e in events[cut:policy])


def test_one_step_overlap_generates_the_next_batch_while_training():
    batches, events = asyncio.run(run_loop(async_level=1))
    assert sorted(batches) == list(range(1, 7))
    for step, batch in batches.items():
        assert {r.policy_min for r in batch.rollouts} <= {max(step - 2, 0), step - 1}
    # batch 2 is generated (with policy 0) before the trainer reports policy 1
    assert events.index(("batch", 2)) < events.index(("policy", 1))
    # ... but never two batches ahead: batch 3 needs policy 1
    assert events.index(("batch", 3)) > events.index(("policy", 1))
    assert all(b.metrics["off_policy/dropped_rollouts"] == 0 for b in batches.values())


def test_envs_are_mixed_by_ratio():
    clock = PolicyClock(async_level=100)
    picked = []

    async def run_group(runner, example_id, task, size):
        picked.append(runner.name)
        return [make_rollout(float(i % 2), env=runner.name) for i in range(2)]

    runners = [FakeRunner(), FakeRunner()]
    runners[0].name, runners[1].name = "a", "b"
    scheduler = Scheduler(
        runners, [3.0, 1.0], run_group, clock, RolloutBuffer(40, max_off_policy_steps=100),
        make_advantage_fn(AdvantageConfig(), 10), 2, 10, max_groups_in_flight=4, on_batch=lambda b: None,
    )
    asyncio.run(asyncio.wait_for(scheduler.run(), timeout=10))
    assert len(picked) == 200
    assert 0.65 < picked.count("a") / len(picked) < 0.85
