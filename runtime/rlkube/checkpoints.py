"""Where checkpoints live, which are complete, and what `ckpt.resume_step` resolves to.

Layout under the checkpoint root (`ckpt.url`: a path or fsspec URL such as
`s3://bucket/run/checkpoints`; `<output_dir>/checkpoints` when unset):
`{trainer,orchestrator}/step_N/` for an RL run, `trainer/step_N/` for SFT. Each process writes
under its own directory only, so on a cluster the orchestrator's pod can be given a writable
mount of `orchestrator/` and none of `trainer/`, whose DCP files the trainer unpickles.

One rule everywhere: a process's part counts only once its `COMPLETE` marker exists, and the
marker is written LAST, after every other file of the part. Object stores have no atomic
directory rename, so the marker is the single source of truth: a save killed midway leaves a
part without a marker, which nothing resumes from. Rewriting a part (the same step saved again
after a resume) removes its marker FIRST. An RL step is resumable only when the trainer's AND
the orchestrator's parts are both complete, so both processes resolve `latest` to the same step
on their own. All I/O goes through fsspec; no torch here.
"""

import logging
import re
from pathlib import Path

import fsspec

logger = logging.getLogger(__name__)

MARKER = "COMPLETE"
RL_PROCESSES = ("trainer", "orchestrator")
_STEP_DIR = re.compile(r"^step_(\d+)$")


def checkpoint_root(output_dir: Path | str, ckpt) -> str:
    """`ckpt.url`, or `<output_dir>/checkpoints` when unset (`ckpt` is a CheckpointConfig)."""
    if ckpt is not None and ckpt.url:
        return ckpt.url.rstrip("/")
    return str(Path(output_dir) / "checkpoints")


def _fs(root: Path | str) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(str(root))
    fs.invalidate_cache()  # another process (or pod) may have written since the last listing
    return fs, path.rstrip("/")


def part_dir(root: Path | str, step: int, process: str) -> str:
    """The URL (or path) of `process`'s part of step `step`."""
    return f"{str(root).rstrip('/')}/{process}/step_{step}"


def is_complete(root: Path | str, step: int, process: str) -> bool:
    fs, path = _fs(part_dir(root, step, process))
    return fs.exists(f"{path}/{MARKER}")


def complete_steps(root: Path | str, processes: tuple[str, ...] = RL_PROCESSES) -> list[int]:
    """Steps whose parts for all `processes` are complete, ascending."""
    fs, path = _fs(root)
    if not fs.isdir(path):
        return []
    markers = set(fs.find(path, withdirs=False))  # one listing, not one request per step
    complete = [{s for s in _steps_in(fs, f"{path}/{p}") if f"{path}/{p}/step_{s}/{MARKER}" in markers}
                for p in processes]
    return sorted(set.intersection(*complete))


def _steps_in(fs: fsspec.AbstractFileSystem, path: str) -> list[int]:
    """The N of each `step_N` directly under `path`."""
    if not fs.isdir(path):
        return []
    return [int(m.group(1)) for entry in fs.ls(path, detail=False)
            if (m := _STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1]))]


def latest_run_checkpoint(root: Path | str, processes: tuple[str, ...] = RL_PROCESSES) -> int | None:
    steps = complete_steps(root, processes)
    return steps[-1] if steps else None


def resolve_resume_step(root: Path | str, resume_step: int | str | None, process: str,
                        processes: tuple[str, ...] = RL_PROCESSES) -> int | None:
    """`ckpt.resume_step` as a step to load, None for a fresh start. `latest` is the newest step
    complete for all `processes` (so every process of a run picks the same one), or a fresh
    start when there is none yet: a run that failed before its first checkpoint starts over
    instead of crash-looping. An explicit step must have a complete `process` part."""
    if resume_step is None:
        return None
    if resume_step == "latest":
        step = latest_run_checkpoint(root, processes)
        if step is None:
            fs, path = _fs(root)
            if old := _steps_in(fs, path):
                raise ValueError(
                    f"ckpt.resume_step: {root} holds checkpoints of steps {sorted(old)} in the layout before "
                    f"per-process directories (step_N/<process>/, now <process>/step_N/): move them there to "
                    "resume from them (their files are unsigned: see rlkube.manifest), or remove them to start fresh"
                )
            logger.info("no complete checkpoint under %s: starting fresh", root)
        return step
    if not is_complete(root, int(resume_step), process):
        raise ValueError(
            f"ckpt.resume_step: {part_dir(root, int(resume_step), process)} is not a complete checkpoint "
            f"(complete steps: {complete_steps(root, processes) or 'none'})"
        )
    return int(resume_step)


def unmark(root: Path | str, step: int, process: str) -> None:
    """Remove the part's marker (if any): from now on it does not count."""
    fs, path = _fs(part_dir(root, step, process))
    if fs.exists(f"{path}/{MARKER}"):
        fs.rm(f"{path}/{MARKER}")


def begin_part(root: Path | str, step: int, process: str) -> str:
    """Make the part ready to be (re)written: unmarked first, then emptied. Returns its URL."""
    unmark(root, step, process)
    fs, path = _fs(part_dir(root, step, process))
    if fs.exists(path):
        fs.rm(path, recursive=True)
    fs.makedirs(path, exist_ok=True)
    return part_dir(root, step, process)


def finish_part(root: Path | str, step: int, process: str, files: dict[str, bytes]) -> str:
    """Write `files` into the part, then its marker: the part is complete. Call it only once
    everything else of the part (every rank's shards) is written."""
    fs, path = _fs(part_dir(root, step, process))
    fs.makedirs(path, exist_ok=True)
    for name, data in files.items():
        fs.pipe_file(f"{path}/{name}", data)
    fs.pipe_file(f"{path}/{MARKER}", b"")
    return part_dir(root, step, process)


def unmark_after(root: Path | str, step: int, process: str) -> list[int]:
    """Resuming from `step` abandons the steps after it: unmark `process`'s parts of them (the
    files stay). Otherwise a second crash, after the resumed run wrote one process's part of a
    later step but before it replaced the other's, would leave that step looking complete with
    halves from two different runs. Returns the unmarked steps."""
    later = [s for s in complete_steps(root, (process,)) if s > step]
    for later_step in later:
        unmark(root, later_step, process)
    return later


def steps_to_delete(steps: list[int], keep_last: int | None, keep_interval: int | None) -> list[int]:
    """Which checkpoints pruning removes: all but the newest `keep_last`, except multiples
    of `keep_interval`."""
    if keep_last is None:
        return []
    kept = set(sorted(steps)[-keep_last:])
    return [s for s in steps if s not in kept and not (keep_interval and s % keep_interval == 0)]


def prune(root: Path | str, process: str, keep_last: int | None, keep_interval: int | None) -> list[int]:
    """Delete whole steps (every part) beyond what `keep_last`/`keep_interval` keep, counting
    the steps where `process`'s part is complete. Markers go first, so a prune killed midway
    leaves nothing that looks complete. Returns the deleted steps."""
    doomed = steps_to_delete(complete_steps(root, (process,)), keep_last, keep_interval)
    fs, path = _fs(root)
    owners = sorted((p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False) if fs.isdir(p)),
                    key=lambda owner: owner != process)  # ours first
    for step in doomed:
        parts = [f"{path}/{owner}/step_{step}" for owner in owners if fs.exists(f"{path}/{owner}/step_{step}")]
        for part in parts:
            if fs.exists(f"{part}/{MARKER}"):
                fs.rm(f"{part}/{MARKER}")
        for part in parts:
            fs.rm(part, recursive=True)
    return doomed
