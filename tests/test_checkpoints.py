"""Which run checkpoints `ckpt.resume_step` resolves to, what a resume abandons and what pruning
removes, on a local directory and on S3 (moto): the COMPLETE marker is the only rule."""

import logging

import fsspec
import pytest
from rlkube.checkpoints import (
    MARKER,
    begin_part,
    complete_steps,
    finish_part,
    is_complete,
    latest_run_checkpoint,
    part_dir,
    prune,
    resolve_resume_step,
    unmark_after,
)

from tests.fixtures.storage import ckpt_root  # noqa: F401


def write_part(root, step, process, marked=True):
    """A part as a killed (`marked=False`) or a finished save leaves it."""
    fs, path = fsspec.core.url_to_fs(part_dir(root, step, process))
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/state", f"{process} {step}".encode())
    if marked:
        fs.pipe_file(f"{path}/{MARKER}", b"")


def read(root, step, process, name="state"):
    fs, path = fsspec.core.url_to_fs(part_dir(root, step, process))
    return fs.cat_file(f"{path}/{name}").decode()


def test_latest_is_the_newest_step_both_processes_completed(ckpt_root):  # noqa: F811
    for step in (2, 4):
        write_part(ckpt_root, step, "trainer")
        write_part(ckpt_root, step, "orchestrator")
    write_part(ckpt_root, 6, "trainer")  # killed before the orchestrator finished its part
    write_part(ckpt_root, 6, "orchestrator", marked=False)
    write_part(ckpt_root, 8, "trainer", marked=False)  # shards written, killed before the marker
    write_part(ckpt_root, 8, "orchestrator")
    assert latest_run_checkpoint(ckpt_root) == 4
    assert resolve_resume_step(ckpt_root, "latest", "trainer") == 4
    assert resolve_resume_step(ckpt_root, "latest", "orchestrator") == 4, "both resolve the same step"
    assert resolve_resume_step(ckpt_root, 2, "trainer") == 2
    assert resolve_resume_step(ckpt_root, 6, "trainer") == 6, "an explicit step needs only its own part"
    with pytest.raises(ValueError, match=r"ckpt.resume_step: .*trainer/step_8 is not a complete checkpoint"):
        resolve_resume_step(ckpt_root, 8, "trainer")
    with pytest.raises(ValueError, match=r"ckpt.resume_step: .*orchestrator/step_3 .*\[2, 4\]"):
        resolve_resume_step(ckpt_root, 3, "orchestrator")


def test_latest_without_a_complete_checkpoint_starts_fresh(ckpt_root, caplog):  # noqa: F811
    caplog.set_level(logging.INFO)
    assert resolve_resume_step(ckpt_root, "latest", "trainer") is None, "nothing written yet"
    write_part(ckpt_root, 2, "trainer")  # the first save was cut short on the orchestrator's side
    assert resolve_resume_step(ckpt_root, "latest", "orchestrator") is None
    assert "no complete checkpoint under" in caplog.text and "starting fresh" in caplog.text
    assert resolve_resume_step(ckpt_root, None, "trainer") is None


def test_resuming_unmarks_only_the_later_parts_of_its_own_process(ckpt_root):  # noqa: F811
    for step in (2, 4, 6):
        write_part(ckpt_root, step, "trainer")
        write_part(ckpt_root, step, "orchestrator")
    assert latest_run_checkpoint(ckpt_root) == 6

    assert unmark_after(ckpt_root, 2, "trainer") == [4, 6]
    assert complete_steps(ckpt_root, ("trainer",)) == [2]
    assert complete_steps(ckpt_root, ("orchestrator",)) == [2, 4, 6]
    assert latest_run_checkpoint(ckpt_root) == 2, "a later orchestrator half cannot pair with an abandoned trainer half"
    assert read(ckpt_root, 6, "trainer") == "trainer 6", "the files stay"
    assert unmark_after(ckpt_root, 2, "trainer") == []
    assert is_complete(ckpt_root, 2, "trainer")


def test_rewriting_a_part_unmarks_and_empties_it_first(ckpt_root):  # noqa: F811
    write_part(ckpt_root, 4, "trainer")
    begin_part(ckpt_root, 4, "trainer")
    assert not is_complete(ckpt_root, 4, "trainer")
    fs, path = fsspec.core.url_to_fs(part_dir(ckpt_root, 4, "trainer"))
    assert not fs.exists(f"{path}/state"), "no file of the old save survives into the new one"
    finish_part(ckpt_root, 4, "trainer", {"new": b"x"})
    assert is_complete(ckpt_root, 4, "trainer") and read(ckpt_root, 4, "trainer", "new") == "x"


def test_pruning_removes_whole_steps_and_keeps_interval_multiples(ckpt_root):  # noqa: F811
    for step in (5, 10, 15, 20):
        write_part(ckpt_root, step, "trainer")
        write_part(ckpt_root, step, "orchestrator")
    write_part(ckpt_root, 25, "trainer", marked=False)  # a save in progress does not count
    assert prune(ckpt_root, "trainer", keep_last=2, keep_interval=10) == [5]
    assert complete_steps(ckpt_root) == [10, 15, 20]
    fs, path = fsspec.core.url_to_fs(ckpt_root)
    assert not fs.exists(f"{path}/trainer/step_5") and not fs.exists(f"{path}/orchestrator/step_5"), \
        "the orchestrator's part goes with the step"
    assert prune(ckpt_root, "trainer", keep_last=None, keep_interval=None) == []


def test_checkpoints_in_the_old_layout_are_named_not_skipped(tmp_path):
    """`step_N/<process>/` (before per-process directories): `latest` does not start the run
    over past them, it says how to move them."""
    old = tmp_path / "step_4" / "trainer"
    old.mkdir(parents=True)
    (old / MARKER).touch()
    with pytest.raises(ValueError, match=r"holds checkpoints of steps \[4\] in the layout before per-process"):
        resolve_resume_step(tmp_path, "latest", "trainer")

