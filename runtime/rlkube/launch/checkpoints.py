"""Which checkpoint steps of an RL run are complete, for `--ckpt.resume-step latest`.

Layout: `<output_dir>/checkpoints/step_N/{trainer,orchestrator}/`. A process's part is complete
once its `COMPLETE` marker exists: writers create it last, after every other file is on disk, so
a run killed mid-save never resumes from half a checkpoint. A step is resumable only when the
trainer's AND the orchestrator's parts are both complete. No torch: the launcher imports this.
"""

import re
from pathlib import Path

MARKER = "COMPLETE"
STEP_DIR = re.compile(r"^step_(\d+)$")


def part_dir(root: Path, step: int, process: str) -> Path:
    return Path(root) / f"step_{step}" / process


def is_complete(root: Path, step: int, process: str) -> bool:
    return (part_dir(root, step, process) / MARKER).is_file()


def complete_steps(root: Path, processes: tuple[str, ...] = ("trainer", "orchestrator")) -> list[int]:
    """Steps whose parts for all `processes` are complete, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if (m := STEP_DIR.match(p.name))]
    return sorted(s for s in steps if all(is_complete(root, s, p) for p in processes))


def unmark_after(root: Path, step: int, process: str) -> list[int]:
    """Resuming from `step` abandons the steps after it: unmark `process`'s parts of them (the
    files stay). Otherwise a second crash, after the resumed run wrote one process's part of a
    later step but before it replaced the other's, would leave that step looking complete with
    halves from two different runs. Returns the unmarked steps."""
    root = Path(root)
    later = [s for s in complete_steps(root, (process,)) if s > step]
    for later_step in later:
        (part_dir(root, later_step, process) / MARKER).unlink()
    return later


def latest_run_checkpoint(root: Path, processes: tuple[str, ...] = ("trainer", "orchestrator")) -> int | None:
    steps = complete_steps(root, processes)
    return steps[-1] if steps else None
