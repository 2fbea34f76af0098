"""How long a run may take (`activeDeadlineSeconds`) and how long it stays once finished
(`ttlSecondsAfterFinished`), from its status times (pure).

A run is several children, so neither is a single child's field: the deadline is the run's
wall time from `status.startTime` (its first unsuspended start), and the TTL deletes the run
object itself, which takes every child with it (ownerReferences), as Kubernetes' TTL controller
does for a Job.
"""

from datetime import datetime

from rlkube_operator.spec import RunSpecBase


def _seconds(since: str, until: str) -> float:
    return (datetime.fromisoformat(until) - datetime.fromisoformat(since)).total_seconds()


def seconds_left(spec: RunSpecBase, status: dict, now: str) -> float | None:
    """Seconds before the run's deadline; None without a deadline or before its start."""
    start = status.get("startTime")
    if spec.active_deadline_seconds is None or not start:
        return None
    return spec.active_deadline_seconds - _seconds(start, now)


def finished_before_deadline(spec: RunSpecBase, status: dict) -> bool:
    """The run ended (Succeeded, or Failed for another reason) before its deadline came."""
    start, end = status.get("startTime"), status.get("completionTime")
    if spec.active_deadline_seconds is None or not (start and end):
        return False
    return _seconds(start, end) < spec.active_deadline_seconds


def deadline_message(spec: RunSpecBase, status: dict) -> str:
    return (f"the run passed spec.activeDeadlineSeconds ({spec.active_deadline_seconds} s from its "
            f"start at {status.get('startTime')})")


def expired(spec: RunSpecBase, status: dict, now: str) -> bool:
    """The finished run has outlived `ttlSecondsAfterFinished`: time to delete it."""
    end = status.get("completionTime")
    if spec.ttl_seconds_after_finished is None or not end:
        return False
    return _seconds(end, now) >= spec.ttl_seconds_after_finished
