"""A run's deadline and its time to live, from its status times (pure)."""

from rlkube_operator import lifetime
from rlkube_operator.spec import SFTRunSpec

START = "2026-01-01T10:00:00Z"


def spec(**fields) -> SFTRunSpec:
    return SFTRunSpec(image="x", **fields)


def test_the_deadline_counts_from_the_runs_start():
    timed = spec(active_deadline_seconds=600)
    assert lifetime.seconds_left(timed, {"startTime": START}, "2026-01-01T10:09:00Z") == 60
    assert lifetime.seconds_left(timed, {"startTime": START}, "2026-01-01T10:11:00Z") == -60
    assert lifetime.seconds_left(timed, {}, "2026-01-01T10:11:00Z") is None  # not started: no clock
    assert lifetime.seconds_left(spec(), {"startTime": START}, "2027-01-01T00:00:00Z") is None


def test_a_run_that_ended_before_its_deadline_keeps_its_own_ending():
    timed = spec(active_deadline_seconds=600)
    assert lifetime.finished_before_deadline(timed, {"startTime": START, "completionTime": "2026-01-01T10:05:00Z"})
    assert not lifetime.finished_before_deadline(timed, {"startTime": START, "completionTime": "2026-01-01T10:10:00Z"})
    assert not lifetime.finished_before_deadline(timed, {"startTime": START})


def test_a_finished_run_expires_ttl_seconds_after_its_completion():
    done = {"startTime": START, "completionTime": "2026-01-01T11:00:00Z"}
    assert not lifetime.expired(spec(ttl_seconds_after_finished=60), done, "2026-01-01T11:00:59Z")
    assert lifetime.expired(spec(ttl_seconds_after_finished=60), done, "2026-01-01T11:01:00Z")
    assert lifetime.expired(spec(ttl_seconds_after_finished=0), done, "2026-01-01T11:00:00Z")
    assert not lifetime.expired(spec(ttl_seconds_after_finished=0), {"startTime": START}, "2027-01-01T00:00:00Z")
    assert not lifetime.expired(spec(), done, "2027-01-01T00:00:00Z")  # no TTL: kept
