"""Read the truth from the children (pure): per-component health from pods, trainer Job state.

A component is never just "initializing": a pod that cannot be scheduled, cannot pull its
image or crash-loops surfaces here with Kubernetes' own reason and the pod's message.
"""

from dataclasses import dataclass

from rlkube_operator.builders import ATTEMPT_ANNOTATION

# Container waiting reasons that will not fix themselves.
BAD_WAITING = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}
# Reasons under which the run is Pending (nothing can run yet) rather than Initializing.
PENDING_REASONS = {"Unschedulable", "ImagePullBackOff", "ErrImagePull", "InvalidImageName"}


@dataclass(frozen=True)
class Health:
    """One component's condition: ready or not, with a CamelCase reason and a message."""

    ready: bool
    reason: str
    message: str
    restarts: int = 0

    @property
    def bad(self) -> bool:
        return self.reason in BAD_WAITING or self.reason == "Unschedulable"


def _containers(pod: dict) -> list[dict]:
    status = pod.get("status", {})
    return status.get("initContainerStatuses", []) + status.get("containerStatuses", [])


def _pod_problem(pod: dict) -> tuple[str, str] | None:
    name = pod["metadata"]["name"]
    for cs in _containers(pod):
        waiting = cs.get("state", {}).get("waiting") or {}
        if waiting.get("reason") in BAD_WAITING:
            return waiting["reason"], f"pod {name}: {waiting.get('message', waiting['reason'])}"
    for cond in pod.get("status", {}).get("conditions", []):
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("reason") or "Unschedulable", f"pod {name}: {cond.get('message', '')}"
    return None


def _pod_ready(pod: dict) -> bool:
    conds = pod.get("status", {}).get("conditions", [])
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def component_health(pods: list[dict], expected: int) -> Health:
    """Health of `expected` pods of one component from what the pods report."""
    restarts = sum(cs.get("restartCount", 0) for pod in pods for cs in _containers(pod))
    restarted = f" ({restarts} container restarts)" if restarts else ""
    for pod in pods:
        if (problem := _pod_problem(pod)) is not None:
            return Health(False, problem[0], problem[1] + restarted, restarts)
    ready = sum(_pod_ready(p) for p in pods)
    if expected and ready >= expected:
        return Health(True, "Ready", f"{ready}/{expected} pods ready{restarted}", restarts)
    if not pods:
        return Health(False, "NoPods", f"0/{expected} pods created", restarts)
    return Health(False, "Starting", f"{ready}/{expected} pods ready", restarts)


def job_attempt(job: dict) -> int:
    return int(job.get("metadata", {}).get("annotations", {}).get(ATTEMPT_ANNOTATION, 0))


def pod_attempt(pod: dict) -> int:
    return int(pod.get("metadata", {}).get("annotations", {}).get(ATTEMPT_ANNOTATION, -1))


def _job_condition(job: dict, type_: str) -> dict | None:
    for cond in job.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def pod_failure(pod: dict) -> str:
    """Why a failed pod failed, from its terminated containers (exit code, OOMKilled, …)."""
    for cs in _containers(pod):
        term = cs.get("state", {}).get("terminated") or cs.get("lastState", {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            detail = f"{term.get('reason', 'Error')}, exit code {term['exitCode']}"
            return f"pod {pod['metadata']['name']} failed ({detail})"
    reason = pod.get("status", {}).get("reason") or "Failed"
    return f"pod {pod['metadata']['name']} failed ({reason})"


def trainer_outcome(job: dict | None, pods: list[dict]) -> tuple[str, str]:
    """(`none`|`suspended`|`running`|`succeeded`|`failed`, message) for the current attempt.
    One failed pod fails the gang even before the Job controller says so."""
    if job is None:
        return "none", "no trainer Job"
    if (cond := _job_condition(job, "Complete")) is not None:
        return "succeeded", cond.get("message") or "trainer Job complete"
    failed = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
    if failed:
        return "failed", pod_failure(failed[0])
    if (cond := _job_condition(job, "Failed")) is not None:
        return "failed", f"trainer Job failed: {cond.get('reason', '')} {cond.get('message', '')}".strip()
    if job.get("spec", {}).get("suspend"):
        return "suspended", "trainer Job suspended"
    return "running", "trainer Job active"
