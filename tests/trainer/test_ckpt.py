"""Which checkpoints resume can see: complete `step_N` directories only."""

import pytest
from rlkube.config import CheckpointConfig
from rlkube.trainer.ckpt import CheckpointManager, complete_steps


def make_step(root, name: str, complete: bool) -> None:
    trainer = root / "checkpoints" / name / "trainer"
    trainer.mkdir(parents=True)
    (trainer / "__0_0.distcp").write_bytes(b"x")
    if complete:
        (trainer / ".metadata").write_bytes(b"x")


@pytest.fixture
def run_dir(tmp_path):
    make_step(tmp_path, "step_2", complete=True)
    make_step(tmp_path, "step_10", complete=True)
    make_step(tmp_path, "step_12", complete=False)  # DCP never wrote its metadata
    make_step(tmp_path, ".step_14.tmp", complete=True)  # finished writing, never renamed
    return tmp_path


def test_only_complete_renamed_steps_count(run_dir):
    assert complete_steps(run_dir) == [2, 10]


def test_latest_picks_the_newest_complete_checkpoint(run_dir):
    manager = CheckpointManager(run_dir, CheckpointConfig(resume_step="latest"), is_main=True)
    assert manager.resolve_resume_step() == 10


def test_latest_without_checkpoints_starts_fresh(tmp_path):
    manager = CheckpointManager(tmp_path, CheckpointConfig(resume_step="latest"), is_main=True)
    assert manager.resolve_resume_step() is None


@pytest.mark.parametrize("step", [12, 14, 3])
def test_an_incomplete_or_missing_step_is_a_clear_error(run_dir, step):
    manager = CheckpointManager(run_dir, CheckpointConfig(resume_step=step), is_main=True)
    with pytest.raises(ValueError, match=rf"ckpt.resume_step: no complete checkpoint for step {step} .*\[2, 10\]"):
        manager.resolve_resume_step()
