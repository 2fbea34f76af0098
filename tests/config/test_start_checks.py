"""Configs that passed every check and `--dry-run`, then died at start with a traceback (an exit
code the operator retries), are refused up front with the field named and exit code 2."""

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rlkube_operator.spec import RLRunSpec

from tests.operator.test_operator_kmock import example


def dry_run(tmp_path, model, *flags):
    return subprocess.run(
        [sys.executable, "-m", "rlkube.entrypoints.main", "rl", "--model.name", str(model), "--output-dir",
         str(tmp_path), *flags, "--dry-run"], check=False, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flags, field, reason", [
    # the orchestrator's scheduler drew from no environment (IndexError at its first batch)
    (["--orchestrator.envs", "[]"], "orchestrator.envs", "at least 1 item"),
    (["--orchestrator.eval", "--orchestrator.eval.envs", "[]"], "orchestrator.eval.envs", "at least 1 item"),
    # the trainer's NCCL group cannot form on a CPU
    (["--weights.type", "nccl", "--trainer.device", "cpu"], "(top level)",
     "weights.type 'nccl' broadcasts from GPU memory, but trainer.device is 'cpu'"),
    # import_callable raised in the orchestrator and the trainer when they started
    (["--orchestrator.advantage.custom", "no_such_module:advantage"], "orchestrator.advantage.custom",
     "cannot import 'no_such_module:advantage': No module named 'no_such_module'"),
    (["--trainer.loss.type", "custom", "--trainer.loss.custom_loss", "os.path:no_such_function"],
     "trainer.loss.custom_loss", "cannot import 'os.path:no_such_function'"),
    (["--trainer.loss.type", "custom", "--trainer.loss.custom_loss", "os.path"], "trainer.loss.custom_loss",
     "'os.path' is not 'package.module:function'"),
])
def test_start_path_assumptions_are_checked_before_start(tmp_path, tiny_model, flags, field, reason):
    result = dry_run(tmp_path, tiny_model, *flags)
    assert result.returncode == 2, result.stderr
    assert f"  {field}: " in result.stderr and reason in result.stderr, result.stderr


def test_an_importable_custom_advantage_passes(tmp_path, tiny_model):
    result = dry_run(tmp_path, tiny_model, "--orchestrator.advantage.custom", "os.path:join")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("config, match", [
    ({"orchestrator": {"envs": []}}, "orchestrator.envs"),
    ({"weights": {"type": "nccl"}, "trainer": {"device": "cpu"}}, "weights.type 'nccl' broadcasts from GPU memory"),
])
def test_the_operator_refuses_them_too(config, match):
    run = example("rlrun.yaml")
    run["spec"]["config"] |= config
    with pytest.raises(ValidationError, match=match):
        RLRunSpec.model_validate(run["spec"])
