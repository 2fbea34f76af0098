"""The orchestrator's part of a run checkpoint: `<output_dir>/checkpoints/step_N/orchestrator/`.

Written when policy N is loaded (so the trainer has consumed batches 1..N). It holds what a
restart needs to lose no finished work: batches already cut for steps after N, finished groups
waiting in the buffer, the task samplers' and the env mixer's positions, counters, and where
policy N's weights are. Rollouts still in flight are not saved (unfinished work).

Atomic: written to a temporary directory, renamed into place, then marked `COMPLETE` (the
marker the launcher's `latest` resolution looks for), so a crash mid-save never leaves a
checkpoint that looks whole.
"""

import json
import os
import shutil
from pathlib import Path

from rlkube.launch.checkpoints import MARKER, is_complete, latest_run_checkpoint, part_dir

STATE_FILE = "state.json"


def save(checkpoints_dir: Path, step: int, state: dict) -> Path:
    final = part_dir(checkpoints_dir, step, "orchestrator")
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with open(tmp / STATE_FILE, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (final / MARKER).touch()
    return final


def resolve_step(checkpoints_dir: Path, resume_step: int | str) -> int:
    """`resume_step` as a step number; `latest` is the newest step complete for both the
    trainer and the orchestrator."""
    if resume_step == "latest":
        step = latest_run_checkpoint(checkpoints_dir)
        if step is None:
            raise ValueError(f"ckpt.resume_step: no complete checkpoint under {checkpoints_dir}")
        return step
    if not is_complete(checkpoints_dir, int(resume_step), "orchestrator"):
        raise ValueError(
            f"ckpt.resume_step: {part_dir(checkpoints_dir, int(resume_step), 'orchestrator')} is not a complete checkpoint"
        )
    return int(resume_step)


def load(checkpoints_dir: Path, step: int) -> dict:
    return json.loads((part_dir(checkpoints_dir, step, "orchestrator") / STATE_FILE).read_text())
