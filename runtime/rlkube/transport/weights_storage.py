"""Weight snapshots on storage: a local path or any fsspec URL (`s3://`, `gs://`, `file://`).

No shared POSIX filesystem is assumed: the trainer writes through fsspec, and a reader on
another machine downloads the snapshot to a local temporary directory before loading it.
"""

import contextlib
import json
import logging
import re
import tempfile
import time
from collections.abc import Iterator

import fsspec
from fsspec.implementations.local import LocalFileSystem

from rlkube.transport.weights_snapshot import COMPLETE, Snapshot, bases_needed, step_dir

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_(\d+)$")


def _fs(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(url)


def _join(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """`path` in the URL form readers get (the protocol kept for remote filesystems)."""
    return fs.unstrip_protocol(path) if not isinstance(fs, LocalFileSystem) else path


def snapshot_location(root: str, step: int) -> str:
    """The location readers load step `step` of the snapshots under `root` from (what
    `write_snapshot` returns once it is written)."""
    fs, root_path = _fs(root)
    return _join(fs, step_dir(root_path, step))


def write_snapshot(root: str, snapshot: Snapshot) -> str:
    """Write `snapshot` under `<root>/step_N/`, the `COMPLETE` marker last; returns the location."""
    fs, root_path = _fs(root)
    target = step_dir(root_path, snapshot.step)
    if fs.exists(f"{target}/{COMPLETE}"):
        fs.rm(f"{target}/{COMPLETE}")  # republishing a step: unmark it before overwriting
    fs.makedirs(target, exist_ok=True)
    snapshot.write_files(fs, target)
    fs.pipe_file(f"{target}/{COMPLETE}", snapshot.marker())
    return snapshot_location(root, snapshot.step)


def list_steps(root: str) -> dict[int, bool]:
    """{step: complete?} of the snapshots under `root`."""
    fs, root_path = _fs(root)
    if not fs.exists(root_path):
        return {}
    steps = {}
    for entry in fs.ls(root_path, detail=False):
        if match := _STEP_DIR.search(entry.rstrip("/")):
            steps[int(match.group(1))] = fs.exists(f"{entry.rstrip('/')}/{COMPLETE}")
    return steps


def prune(root: str, keep_last: int | None) -> list[int]:
    """Delete all but the newest `keep_last` complete snapshots (and those their deltas build
    on), and incomplete ones older than the newest complete one (left by a crash mid-publish).
    Returns the deleted steps."""
    steps = list_steps(root)
    complete = sorted(s for s, done in steps.items() if done)
    if not complete:
        return []
    doomed = [s for s, done in steps.items() if not done and s < complete[-1]]
    if keep_last is not None:
        needed = bases_needed(complete[-keep_last:], lambda step: _base_of(root, step))
        doomed += [s for s in complete[:-keep_last] if s not in needed]
    return _delete(root, doomed)


def _base_of(root: str, step: int) -> int | None:
    """The step a delta snapshot applies to (None: a full snapshot, or none there)."""
    try:
        return read_marker(step_dir(root, step)).get("base")
    except FileNotFoundError:
        return None


def discard_after(root: str, step: int) -> list[int]:
    """Delete the snapshots newer than `step`: when a run resumes from `step`, they belong to
    the continuation it abandons, and left in place they would outrank (and get pruned in favour
    of) the snapshots it writes. Returns the deleted steps."""
    return _delete(root, [s for s in list_steps(root) if s > step])


def _delete(root: str, steps: list[int]) -> list[int]:
    """Delete the snapshots of `steps` under `root`; returns them sorted."""
    fs, root_path = _fs(root)
    for step in sorted(steps):
        fs.rm(step_dir(root_path, step), recursive=True)
    return sorted(steps)


def read_marker(location: str) -> dict:
    """The snapshot's `COMPLETE` marker; a clear error when the snapshot is missing or partial."""
    fs, path = _fs(location)
    fs.invalidate_cache(path)  # object-store listings are cached; a marker written since counts
    marker = f"{path.rstrip('/')}/{COMPLETE}"
    if not fs.exists(marker):
        what = "is incomplete (no COMPLETE marker yet)" if fs.exists(path) else "does not exist"
        raise FileNotFoundError(f"weight snapshot {location} {what}")
    return json.loads(fs.cat_file(marker))


def wait_for_marker(location: str, timeout_s: float, poll_s: float = 0.2) -> dict:
    """`read_marker`, waiting up to `timeout_s` for a snapshot that is still being written:
    a resumed run asks inference for its checkpoint's policy while the trainer, still
    starting, may be republishing it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return read_marker(location)
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(poll_s)


@contextlib.contextmanager
def local_snapshot(location: str, timeout_s: float = 0) -> Iterator[str]:
    """A local directory holding the snapshot at `location` (waiting up to `timeout_s` for it
    to be complete): the path itself when it is local, else a temporary download that is
    deleted afterwards."""
    marker = wait_for_marker(location, timeout_s)
    fs, path = _fs(location)
    if isinstance(fs, LocalFileSystem):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="rlkube-weights-") as tmp:
        files = [f for f in marker["files"] if f != COMPLETE]
        fs.get([f"{path.rstrip('/')}/{f}" for f in files], [f"{tmp}/{f}" for f in files])
        logger.info("downloaded %d files of %s to %s", len(files), location, tmp)
        yield tmp
