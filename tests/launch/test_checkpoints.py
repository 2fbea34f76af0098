"""Which run checkpoints `latest` may resume from, and what a resume abandons."""

from rlkube.launch.checkpoints import (
    MARKER,
    complete_steps,
    is_complete,
    latest_run_checkpoint,
    part_dir,
    unmark_after,
)


def write_part(root, step, process):
    part = part_dir(root, step, process)
    part.mkdir(parents=True)
    (part / "state").write_text(f"{process} {step}")
    (part / MARKER).touch()


def test_resuming_unmarks_only_the_later_parts_of_its_own_process(tmp_path):
    for step in (2, 4, 6):
        write_part(tmp_path, step, "trainer")
        write_part(tmp_path, step, "orchestrator")
    assert latest_run_checkpoint(tmp_path) == 6

    assert unmark_after(tmp_path, 2, "trainer") == [4, 6]
    assert complete_steps(tmp_path, ("trainer",)) == [2]
    assert complete_steps(tmp_path, ("orchestrator",)) == [2, 4, 6]
    assert latest_run_checkpoint(tmp_path) == 2, "a later step's orchestrator half cannot pair with an abandoned trainer half"
    assert (part_dir(tmp_path, 6, "trainer") / "state").read_text() == "trainer 6", "the files stay"
    assert unmark_after(tmp_path, 2, "trainer") == []
    assert is_complete(tmp_path, 2, "trainer")
