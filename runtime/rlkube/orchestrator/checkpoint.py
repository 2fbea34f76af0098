"""The orchestrator's part of a run checkpoint: `<ckpt root>/orchestrator/step_N/`.

Written when policy N is loaded (so the trainer has consumed batches 1..N). It holds what a
restart needs to lose no finished work: batches already cut for steps after N, finished groups
waiting in the buffer, the task samplers' and the env mixer's positions, counters, and where
policy N's weights are. Rollouts still in flight are not saved (unfinished work).

The root is a path or an fsspec URL (`ckpt.url`). `state.json` is written first and the
`COMPLETE` marker last (rewriting a step removes the marker first), so a crash mid-save never
leaves a part that counts (rlkube.checkpoints).
"""

import json
from pathlib import Path

import fsspec

from rlkube.checkpoints import RL_PROCESSES, begin_part, finish_part, part_dir, resolve_resume_step

PROCESS = "orchestrator"
STATE_FILE = "state.json"


def save(root: Path | str, step: int, state: dict) -> str:
    begin_part(root, step, PROCESS)
    return finish_part(root, step, PROCESS, {STATE_FILE: json.dumps(state).encode()})


def resolve_step(root: Path | str, resume_step: int | str | None, alone: bool = False) -> int | None:
    """`ckpt.resume_step` as a step number, None for a fresh start; `latest` is the newest step
    complete for both the trainer and the orchestrator (the trainer resolves the same), or with
    `alone` for the orchestrator's part alone (a pool member's: its trainer's parts are in the
    pool's storage, and the orchestrator tells the pool trainer which step to resume from)."""
    return resolve_resume_step(root, resume_step, PROCESS, (PROCESS,) if alone else RL_PROCESSES)


def load(root: Path | str, step: int) -> dict:
    fs, path = fsspec.core.url_to_fs(part_dir(root, step, PROCESS))
    return json.loads(fs.cat_file(f"{path}/{STATE_FILE}"))
