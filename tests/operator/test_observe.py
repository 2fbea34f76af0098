"""Pure pieces of the status: component health from pods, conditions kept by type."""

from rlkube_operator.conditions import Conditions
from rlkube_operator.observe import component_health, trainer_outcome

from tests.operator.cluster import (
    pod_disrupted,
    pod_failed,
    pod_running,
    pod_unschedulable,
    pod_waiting,
)


def pod(name: str, status: dict) -> dict:
    return {"metadata": {"name": name}, "status": status}


def test_crash_loop_names_the_pod_and_counts_restarts():
    health = component_health([pod("a-0", pod_running()), pod("a-1", pod_waiting("CrashLoopBackOff", "back-off", 4))], 2)
    assert (health.ready, health.reason, health.bad) == (False, "CrashLoopBackOff", True)
    assert health.message == "pod a-1: back-off (4 container restarts)"


def test_ready_needs_every_expected_pod():
    assert component_health([pod("a-0", pod_running())], 2).reason == "Starting"
    assert component_health([pod("a-0", pod_running()), pod("a-1", pod_running())], 2).ready
    assert component_health([], 1).reason == "NoPods"
    assert component_health([pod("a-0", pod_unschedulable("no GPU"))], 1).reason == "Unschedulable"


def test_one_failed_pod_fails_the_gang_before_the_job_says_so():
    job = {"metadata": {"name": "j"}, "spec": {}, "status": {}}
    outcome, why = trainer_outcome(job, [pod("j-0", pod_running()), pod("j-1", pod_failed(137, "OOMKilled"))])
    assert outcome == "failed" and why == "pod j-1 failed (OOMKilled, exit code 137)"
    assert trainer_outcome(None, [])[0] == "none"
    assert trainer_outcome({**job, "spec": {"suspend": True}}, [])[0] == "suspended"


def test_transition_time_moves_only_when_the_status_changes():
    c = Conditions([], generation=1, now="t1")
    c.set("Ready", False, "Starting", "0/1")
    c.now, c.generation = "t2", 2
    c.set("Ready", False, "CrashLoopBackOff", "pod x")
    assert c.items == [{"type": "Ready", "status": "False", "reason": "CrashLoopBackOff", "message": "pod x",
                        "lastTransitionTime": "t1", "observedGeneration": 2}]
    c.now = "t3"
    c.set("Ready", True, "Running", "")
    assert c.items[0]["lastTransitionTime"] == "t3"


def test_a_gang_with_a_disrupted_pod_is_disrupted_whichever_pod_failed_first():
    """Pod 1 is being preempted (still terminating); pod 0 lost its peer and failed first."""
    job = {"metadata": {"name": "t-0"}, "spec": {}}
    preempted = pod_running() | {"conditions": pod_disrupted()["conditions"]}
    outcome, why = trainer_outcome(job, [pod("t-0-0", pod_failed(exit_code=1)), pod("t-0-1", preempted)])
    assert outcome == "disrupted" and why.startswith("pod t-0-1 was disrupted (PreemptionByScheduler: Preempted")
    assert trainer_outcome(job, [pod("t-0-0", pod_failed(exit_code=1)), pod("t-0-1", pod_running())])[0] == "failed"


def test_pods_killed_by_the_jobs_deadline_are_the_runs_deadline_not_a_failure():
    """The Job controller marks the Job (FailureTarget, then Failed) before killing its pods."""
    for type_ in ("FailureTarget", "Failed"):
        job = {"metadata": {"name": "t-0"}, "spec": {"activeDeadlineSeconds": 60}, "status": {"conditions": [
            {"type": type_, "status": "True", "reason": "DeadlineExceeded",
             "message": "Job was active longer than specified deadline"}]}}
        outcome, why = trainer_outcome(job, [pod("t-0-0", pod_failed(exit_code=143))])
        assert outcome == "deadline" and "longer than specified deadline" in why, type_


def test_a_job_failed_by_its_pod_failure_policy_is_invalid_even_with_its_pods_gone():
    """The Job controller's `FailJob` (exit code 2) is never a failure to restart from."""
    why = "Container trainer for pod ns/rt-trainer-0-0 failed with exit code 2 matching FailJob rule at index 0"
    job = {"metadata": {}, "spec": {}, "status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": why}]}}
    assert trainer_outcome(job, []) == ("invalid", f"trainer Job failed: {why}")
    backoff = {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}
    assert trainer_outcome(job | {"status": {"conditions": [backoff]}}, [])[0] == "failed"
