"""Learning-rate schedules and checkpoint pruning rules."""

import pytest
from rlkube.checkpoints import steps_to_delete
from rlkube.config import SchedulerConfig
from rlkube.trainer.optim import lr_factor


def test_warmup_is_linear_to_the_peak():
    config = SchedulerConfig(warmup_steps=4)
    assert [lr_factor(s, config, 100) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]


def test_constant_stays_at_the_peak():
    assert lr_factor(99, SchedulerConfig(type="constant"), 100) == 1.0


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decays_reach_min_lr_ratio_at_max_steps(kind):
    config = SchedulerConfig(type=kind, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(10, config, 110) == pytest.approx(1.0)
    assert lr_factor(60, config, 110) == pytest.approx(0.55)  # halfway: both shapes give 0.5
    assert lr_factor(110, config, 110) == pytest.approx(0.1)
    factors = [lr_factor(s, config, 110) for s in range(10, 111)]
    assert factors == sorted(factors, reverse=True)


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_decay_steps_hold_the_peak_then_decay_over_the_last_steps(kind):
    config = SchedulerConfig(type=kind, warmup_steps=5, decay_steps=40)
    assert [lr_factor(s, config, 140) for s in (5, 50, 100)] == [1.0, 1.0, 1.0]
    assert lr_factor(120, config, 140) == pytest.approx(0.5)  # halfway through the decay
    assert lr_factor(140, config, 140) == pytest.approx(0.0)
    factors = [lr_factor(s, config, 140) for s in range(100, 141)]
    assert factors == sorted(factors, reverse=True) and factors[1] < 1.0


def test_decay_steps_longer_than_the_run_decay_from_the_end_of_warmup():
    whole_run = SchedulerConfig(type="linear", warmup_steps=10)
    config = SchedulerConfig(type="linear", warmup_steps=10, decay_steps=500)
    assert lr_factor(60, config, 110) == pytest.approx(lr_factor(60, whole_run, 110)) == 0.5


def test_decay_steps_on_a_constant_schedule_is_refused():
    with pytest.raises(ValueError, match="decay_steps"):
        SchedulerConfig(type="constant", decay_steps=10)


def test_cosine_is_above_linear_early_on():
    cos, lin = SchedulerConfig(type="cosine"), SchedulerConfig(type="linear")
    assert lr_factor(20, cos, 100) > lr_factor(20, lin, 100)


def test_pruning_keeps_the_newest_and_interval_multiples():
    steps = [10, 20, 30, 40, 50, 60]
    assert steps_to_delete(steps, keep_last=2, keep_interval=None) == [10, 20, 30, 40]
    assert steps_to_delete(steps, keep_last=2, keep_interval=30) == [10, 20, 40]
    assert steps_to_delete(steps, keep_last=None, keep_interval=30) == []
