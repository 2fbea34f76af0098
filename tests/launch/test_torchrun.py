"""`rlkube torchrun` (the trainer pods' launcher) keeps a deterministic failure's exit code 2:
the real command line, the real torchrun, real rank processes."""

import subprocess
import sys

import pytest

TORCHRUN = [sys.executable, "-m", "rlkube.entrypoints.main", "torchrun", "--standalone", "--nproc-per-node=1"]


def run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout)


def test_a_missing_model_exits_2_naming_the_field_before_any_rank_starts():
    done = run([*TORCHRUN, "-m", "rlkube.entrypoints.trainer", "--model.name", "/nowhere/model"])
    assert done.returncode == 2, done.stderr
    assert "rlkube trainer: error: invalid config:\n  model.name: '/nowhere/model' does not exist" in done.stderr
    assert "local_rank" not in done.stderr  # torchrun never started a rank


@pytest.mark.parametrize(("rank_argv", "code"), [
    (["-m", "rlkube.entrypoints.model", "no-such-subcommand"], 2),  # an error the rank itself finds
    (["--no-python", sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], 1),  # killed (OOM, a signal): retriable, as before
])
def test_the_launcher_exits_2_when_a_rank_did_where_torchrun_exits_1(rank_argv, code):
    done = run([*TORCHRUN, *rank_argv])
    assert done.returncode == code, done.stderr
    assert ("a rank exited with code 2" in done.stderr) == (code == 2)
    plain = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1", *rank_argv])
    assert plain.returncode == 1  # what every trainer pod exited with before
