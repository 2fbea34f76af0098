"""Which SFT checkpoints resume can see: `trainer/step_N` parts marked COMPLETE, nothing else."""

from pathlib import Path

import pytest
from rlkube.checkpoints import MARKER, complete_steps
from rlkube.config import CheckpointConfig
from rlkube.trainer.ckpt import CheckpointManager


def make_step(root: Path, name: str, marked: bool) -> None:
    trainer = root / "checkpoints" / "trainer" / name
    trainer.mkdir(parents=True)
    (trainer / "__0_0.distcp").write_bytes(b"x")
    (trainer / ".metadata").write_bytes(b"x")
    if marked:
        (trainer / MARKER).touch()


@pytest.fixture
def run_dir(tmp_path):
    make_step(tmp_path, "step_2", marked=True)
    make_step(tmp_path, "step_10", marked=True)
    make_step(tmp_path, "step_12", marked=False)  # DCP finished, killed before the marker
    make_step(tmp_path, ".step_14.tmp", marked=True)  # not a step directory
    return tmp_path


def manager(run_dir, **ckpt) -> CheckpointManager:
    return CheckpointManager(run_dir, CheckpointConfig(**ckpt), is_main=True)


def test_only_marked_steps_count(run_dir):
    assert complete_steps(run_dir / "checkpoints", ("trainer",)) == [2, 10]


def test_latest_picks_the_newest_complete_checkpoint(run_dir):
    assert manager(run_dir, resume_step="latest").resolve_resume_step() == 10


def test_latest_without_checkpoints_starts_fresh(tmp_path):
    assert manager(tmp_path, resume_step="latest").resolve_resume_step() is None


def test_the_url_replaces_the_output_dir(run_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("bucket")
    assert manager(elsewhere, resume_step="latest", url=str(run_dir / "checkpoints")).resolve_resume_step() == 10


@pytest.mark.parametrize("step", [12, 14, 3])
def test_an_incomplete_or_missing_step_is_a_clear_error(run_dir, step):
    with pytest.raises(ValueError, match=rf"ckpt.resume_step: .*trainer/step_{step} is not a complete .*\[2, 10\]"):
        manager(run_dir, resume_step=step).resolve_resume_step()
