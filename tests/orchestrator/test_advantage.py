import pytest
from rlkube.config import AdvantageConfig
from rlkube.orchestrator.advantage import group_advantages, make_advantage_fn
from rlkube.orchestrator.scheduler import score_group

from tests.orchestrator.helpers import make_rollout


def test_group_mean_baseline_by_default():
    fn = make_advantage_fn(AdvantageConfig(), max_tokens=100)
    assert fn([1.0, 0.0, 0.0, 1.0], [5, 5, 5, 5]) == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert fn([0.2, 0.8], [1, 1]) == pytest.approx([-0.3, 0.3])


def test_all_equal_rewards_give_zero_advantage():
    fn = make_advantage_fn(AdvantageConfig(std_normalize=True), max_tokens=100)
    assert fn([1.0, 1.0, 1.0], [3, 9, 27]) == [0.0, 0.0, 0.0]


def test_std_normalization():
    # rewards 1, 0: mean 0.5, population std 0.5 -> advantages +-1
    got = group_advantages([1.0, 0.0], [1, 1], std_normalize=True, length_penalty=0.0, max_tokens=10)
    assert got == pytest.approx([1.0, -1.0], abs=1e-5)


def test_length_penalty_is_subtracted_before_the_baseline():
    # shaped = r - 0.5 * n / 100: [1 - 0.1, 1 - 0.4] = [0.9, 0.6]; mean 0.75
    got = group_advantages([1.0, 1.0], [20, 80], std_normalize=False, length_penalty=0.5, max_tokens=100)
    assert got == pytest.approx([0.15, -0.15])


def custom_advantage(rewards, completion_tokens):
    return [r * 10 + n for r, n in zip(rewards, completion_tokens)]


def test_custom_by_import_path():
    fn = make_advantage_fn(AdvantageConfig(custom="tests.orchestrator.test_advantage:custom_advantage"), max_tokens=1)
    assert fn([1.0, 0.5], [2, 3]) == [12.0, 8.0]


@pytest.mark.parametrize(
    "path, reason",
    [("no_colon", "is not 'package.module:function'"), ("tests.nope:fn", "cannot import"), ("math:pi", "not callable")],
)
def test_custom_import_errors_name_the_field(path, reason):
    with pytest.raises((ValueError, TypeError), match=f"advantage.custom: .*{reason}"):
        make_advantage_fn(AdvantageConfig(custom=path), max_tokens=1)


def test_score_group_skips_errored_and_empty_rollouts():
    ok_hi, ok_lo = make_rollout(1.0), make_rollout(0.0)
    errored = make_rollout(1.0)
    errored.error = "ProviderError: boom"
    empty = make_rollout(1.0, completion_len=0)
    fn = make_advantage_fn(AdvantageConfig(), max_tokens=10)
    score_group([ok_hi, errored, ok_lo, empty], fn)
    assert (ok_hi.advantage, ok_lo.advantage) == (0.5, -0.5)
    assert ok_hi.samples[0].advantage == 0.5
    assert errored.advantage == 0.0 and empty.advantage == 0.0
