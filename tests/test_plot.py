"""`rlkube plot`: the real command, run as a process on metrics files written by `MetricsSink`."""

import math
import subprocess
import sys

import numpy as np
import pytest
from rlkube.metrics import MetricsSink

from tests.fixtures import prerequisites

matplotlib_image = prerequisites.import_module("matplotlib.image", "rlkube plot needs matplotlib (rlkube[plot])")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
STEPS = 30


def rlkube_plot(*args):
    return subprocess.run([sys.executable, "-m", "rlkube.entrypoints.main", "plot", *map(str, args)],
                          check=False, capture_output=True, text=True, timeout=120)


def write_run(run_dir, reward):
    """A run's metrics as `rlkube rl` logs them: the orchestrator's batch n+1 before the policy
    update and eval of step n, the trainer's loss stats, throughput and step times."""
    with MetricsSink(run_dir, "orchestrator", console=False) as orchestrator, \
            MetricsSink(run_dir, "trainer", console=False) as trainer:
        orchestrator.log(0, {"eval/reverse_text/avg@1": 0.2, "eval/reverse_text/pass@1": 0.0})
        for step in range(1, STEPS + 1):
            orchestrator.log(step, {"reward/all/mean": reward(step), "rollouts": 64.0})
            if step > 1:
                orchestrator.log(step - 1, {"time/update_weights": 0.1, "policy_step": float(step - 1)})
            if step % 10 == 0:
                orchestrator.log(step, {"eval/reverse_text/avg@1": 0.2 + step / 50})
            trainer.log(step, {
                "loss/mean": -0.01, "mismatch_kl/mean": 0.01 / step, "entropy/mean": 5.6 - step / 100,
                "perf/tokens_per_s": 1000.0 + step, "time/wait_for_batch": 60.0 if step == 1 else 0.5,
                "time/forward_backward": 0.8, "time/optimizer": 0.05, "time/step": 1.35,
            })


def rising(step):
    return 0.1 + 0.8 * step / STEPS + 0.05 * math.sin(step)


def falling(step):
    return 0.9 - 0.8 * step / STEPS + 0.05 * math.sin(step)


def test_every_logged_panel_is_a_png_and_the_rest_are_skipped_with_a_note(tmp_path):
    write_run(tmp_path / "run", rising)
    result = rlkube_plot(tmp_path / "run")
    assert result.returncode == 0, result.stderr
    plots = tmp_path / "run" / "plots"
    for name in ("reward", "eval", "kl", "entropy", "throughput", "time", "curves"):
        data = (plots / f"{name}.png").read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000, name
        image = matplotlib_image.imread(plots / f"{name}.png")
        assert image[..., :3].std() > 0.05, f"{name}.png is blank"
    assert not (plots / "sft_loss.png").exists()
    assert "sft_loss: skipped, no metrics/sft.jsonl" in result.stdout


def test_an_agentic_run_shows_its_latency_lag_and_rollout_panels(tmp_path):
    """The orchestrator's histograms (rlkube.histogram) and rollout counts as `rlkube rl` logs them."""
    from rlkube.histogram import Histogram

    with MetricsSink(tmp_path / "run", "orchestrator", console=False) as orchestrator:
        for step in range(1, STEPS + 1):
            orchestrator.log(step, {
                **Histogram("rollout/latency_s", [1.0 + step / 10, 9.0]).summary(),
                **Histogram("tool/latency_s", [0.2, 0.2, 4.0]).summary(),
                **Histogram("off_policy/token_lag", [0, 1, step % 3]).summary(),
                "tool/calls": 300.0, "tool/timeouts": 3.0, "tool/errors": 1.0,
                "rollouts/in_flight": 128.0, "rollouts/reissued": 0.0, "off_policy/dropped_rollouts": float(step % 4),
                "time/update_weights": 0.3,
            })
    result = rlkube_plot(tmp_path / "run")
    assert result.returncode == 0, result.stderr
    for name in ("rollout_latency", "tool_latency", "tool_calls", "policy_lag", "rollouts", "weight_update"):
        image = matplotlib_image.imread(tmp_path / "run" / "plots" / f"{name}.png")
        assert image[..., :3].std() > 0.05, f"{name}.png is blank"


@pytest.mark.parametrize("reward", [rising, falling])
def test_the_reward_curve_goes_the_way_the_reward_went(tmp_path, reward):
    write_run(tmp_path / "run", reward)
    result = rlkube_plot(tmp_path / "run", "--out", tmp_path / "png")
    assert result.returncode == 0, result.stderr
    rgb = matplotlib_image.imread(tmp_path / "png" / "reward.png")[..., :3]
    line = np.abs(rgb - np.array([0x1F, 0x77, 0xB4]) / 255).max(axis=-1) < 0.08  # the curve's colour (C0)
    rows, columns = np.nonzero(line)
    assert len(rows) > 100, "no reward curve drawn"
    left, right = columns < np.median(columns), columns > np.median(columns)
    rises = rows[right].mean() < rows[left].mean()  # image rows grow downwards
    assert rises == (reward is rising)


def test_a_half_written_last_line_is_ignored(tmp_path):
    write_run(tmp_path, rising)
    with open(tmp_path / "metrics" / "trainer.jsonl", "a") as f:
        f.write('{"step": 31, "entropy/me')
    assert rlkube_plot(tmp_path, "--out", tmp_path / "png").returncode == 0


def test_bad_input_exits_2_naming_the_path(tmp_path):
    missing = tmp_path / "no-such-run"
    result = rlkube_plot(missing)
    assert result.returncode == 2 and f"{missing}: no such directory" in result.stderr

    (tmp_path / "empty").mkdir()
    result = rlkube_plot(tmp_path / "empty")
    assert result.returncode == 2 and f"{tmp_path / 'empty'}: no metrics files" in result.stderr
    assert not (tmp_path / "empty" / "plots").exists()

    write_run(tmp_path / "run", rising)
    trainer = tmp_path / "run" / "metrics" / "trainer.jsonl"
    lines = trainer.read_text().splitlines()
    trainer.write_text("\n".join(lines[:2] + ["not json"] + lines[2:]) + "\n")
    result = rlkube_plot(tmp_path / "run")
    assert result.returncode == 2 and f"{trainer}:3: not a JSON record" in result.stderr
