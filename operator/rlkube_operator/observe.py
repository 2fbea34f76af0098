"""Read the truth from the children (pure): per-component health from pods, trainer Job state.

A component is never just "initializing": a pod that cannot be scheduled, cannot pull its
image or crash-loops surfaces here with Kubernetes' own reason and the pod's message.
"""

from dataclasses import dataclass

from rlkube.config.cli import EXIT_INVALID, VERSION_SKEW, read_finished_step

from rlkube_operator.builders import ATTEMPT_ANNOTATION
from rlkube_operator.names import RunRef

# Container waiting reasons that will not fix themselves.
BAD_WAITING = {
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
}
# Pod events that keep a scheduled pod from starting: a ReadWriteOnce volume attached to
# another node ("Multi-Attach error"), a volume that cannot be mounted.
VOLUME_REASONS = {"FailedAttachVolume", "FailedMount"}
# Reasons under which the run is Pending (nothing can run yet) rather than Initializing.
PENDING_REASONS = {"Unschedulable", "ImagePullBackOff", "ErrImagePull", "InvalidImageName"} | VOLUME_REASONS
# The run's image is older than the operator that wrote its config, and someone set a field the
# image does not know: no restart fixes that (the runtime's termination message says which).
CONFIG_INCOMPATIBLE = "ConfigIncompatible"
# A container exited 2 (`EXIT_INVALID`): an invalid config, a missing model. The run fails at once.
INVALID_CONFIG = "InvalidConfig"


@dataclass(frozen=True)
class Health:
    """One component's condition: ready or not, with a CamelCase reason and a message."""

    ready: bool
    reason: str
    message: str
    restarts: int = 0

    @property
    def bad(self) -> bool:
        return self.reason in BAD_WAITING or self.reason in PENDING_REASONS or self.reason == CONFIG_INCOMPATIBLE


def _containers(pod: dict) -> list[dict]:
    status = pod.get("status", {})
    return status.get("initContainerStatuses", []) + status.get("containerStatuses", [])


def _terminations(pod: dict) -> list[dict]:
    """The containers' current and last terminated states."""
    states = [cs.get(key, {}).get("terminated") for cs in _containers(pod) for key in ("state", "lastState")]
    return [t for t in states if t]


def _one_line(message: str) -> str:
    return "; ".join(line.strip() for line in message.strip().splitlines() if line.strip())


def config_incompatibility(pod: dict) -> str | None:
    """The runtime's error, on one line, when the pod's config has a field its image does not
    know (`rlkube.config.cli` writes it to the termination message)."""
    for term in _terminations(pod):
        if VERSION_SKEW in (message := term.get("message") or ""):
            return _one_line(message)
    return None


def invalid_exit(pods: list[dict]) -> tuple[str, str] | None:
    """(reason, message) when a container of one of `pods` exited 2 (`EXIT_INVALID`): a failure
    no restart fixes. The message is the container's termination message on one line (the
    runtime's error naming the field, or the log's tail: `FallbackToLogsOnError`)."""
    for pod in pods:
        for term in _terminations(pod):
            if term.get("exitCode") == EXIT_INVALID:
                message = _one_line(term.get("message") or "") or "no termination message"
                reason = CONFIG_INCOMPATIBLE if VERSION_SKEW in message else INVALID_CONFIG
                return reason, f"pod {pod['metadata']['name']} exited with code {EXIT_INVALID}: {message}"
    return None


def finished_step(pods: list[dict]) -> int | None:
    """The last step the trainer of `pods` trained, from the termination message its rank 0
    left as it exited 0 (`rlkube.config.cli.write_finished_step`); None without one (a runtime
    older than that, or a pod already gone)."""
    for pod in pods:
        for term in _terminations(pod):
            if term.get("exitCode") == 0 and (step := read_finished_step(term.get("message") or "")) is not None:
                return step
    return None


def _pod_problem(pod: dict, volume_events: dict[str, dict]) -> tuple[str, str] | None:
    name = pod["metadata"]["name"]
    if (incompatible := config_incompatibility(pod)) is not None:
        return CONFIG_INCOMPATIBLE, f"pod {name}: {incompatible}"
    if creating(pod) and (event := volume_events.get(name)) is not None:
        return event["reason"], f"pod {name}: {event.get('message', event['reason'])}"
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


def creating(pod: dict) -> bool:
    """Scheduled on a node but not started: where volume attach and mount errors keep a pod."""
    status = pod.get("status", {})
    scheduled = pod.get("spec", {}).get("nodeName") or any(
        c.get("type") == "PodScheduled" and c.get("status") == "True" for c in status.get("conditions", [])
    )
    waiting = any((cs.get("state", {}).get("waiting") or {}).get("reason") == "ContainerCreating"
                  for cs in _containers(pod))
    return status.get("phase") == "Pending" and bool(scheduled or waiting)


def volume_problems(pods: list[dict], events: list[dict]) -> dict[str, dict]:
    """Pod name → its newest volume event (Multi-Attach, mount failure), for pods still creating."""
    uids = {p["metadata"]["name"]: p["metadata"].get("uid") for p in pods if creating(p)}
    out: dict[str, dict] = {}
    for event in sorted(events, key=_event_time):
        obj = event.get("involvedObject") or {}
        name = obj.get("name")
        if event.get("reason") in VOLUME_REASONS and name in uids and obj.get("uid") in (None, uids[name]):
            out[name] = event
    return out


def _event_time(event: dict) -> str:
    return event.get("lastTimestamp") or event.get("eventTime") or event.get("metadata", {}).get("creationTimestamp") or ""


def component_health(pods: list[dict], expected: int, volume_events: dict[str, dict] | None = None) -> Health:
    """Health of `expected` pods of one component from what the pods (and their volume
    events) report."""
    restarts = sum(cs.get("restartCount", 0) for pod in pods for cs in _containers(pod))
    restarted = f" ({restarts} container restarts)" if restarts else ""
    for pod in pods:
        if (problem := _pod_problem(pod, volume_events or {})) is not None:
            return Health(False, problem[0], problem[1] + restarted, restarts)
    ready = sum(_pod_ready(p) for p in pods)
    if expected and ready >= expected:
        return Health(True, "Ready", f"{ready}/{expected} pods ready{restarted}", restarts)
    if not pods:
        return Health(False, "NoPods", f"0/{expected} pods created", restarts)
    return Health(False, "Starting", f"{ready}/{expected} pods ready", restarts)


def replicas_status(run: RunRef, pods: list[dict], desired: int) -> dict:
    """An RLRun's `status.inference` from its inference pods: what its scale subresource
    reports (pods that exist, their selector) and the `ready/desired` printer column."""
    ready = sum(_pod_ready(p) for p in pods)
    selector = ",".join(f"{k}={v}" for k, v in sorted(run.service_selector("inference").items()))
    return {"replicas": len(pods), "readyReplicas": ready, "ready": f"{ready}/{desired}", "selector": selector}


def job_attempt(job: dict) -> int:
    return int(job.get("metadata", {}).get("annotations", {}).get(ATTEMPT_ANNOTATION, 0))


def pod_attempt(pod: dict) -> int:
    return int(pod.get("metadata", {}).get("annotations", {}).get(ATTEMPT_ANNOTATION, -1))


def job_condition(job: dict, type_: str) -> dict | None:
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
            incompatible = config_incompatibility(pod)
            return f"pod {pod['metadata']['name']} failed ({detail})" + (f": {incompatible}" if incompatible else "")
    reason = pod.get("status", {}).get("reason") or "Failed"
    return f"pod {pod['metadata']['name']} failed ({reason})"


def disruption(pod: dict) -> dict | None:
    """The pod's `DisruptionTarget` condition: preempted, evicted, drained, or its node gone."""
    for cond in pod.get("status", {}).get("conditions", []) or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return cond
    return None


def trainer_outcome(job: dict | None, pods: list[dict]) -> tuple[str, str]:
    """(`none`|`suspended`|`running`|`succeeded`|`failed`|`disrupted`|`deadline`|`invalid`,
    message) for the current attempt; `invalid`: the Job failed by its `podFailurePolicy` (a pod
    exited 2, see `invalid_exit`). One failed pod fails the gang even before the Job controller says so; but pods of a
    suspended Job are killed by the suspension, not failed. A gang with a disrupted pod is
    `disrupted`, whichever pod failed first: a peer of a preempted pod fails too, losing it."""
    if job is None:
        return "none", "no trainer Job"
    if (cond := job_condition(job, "Complete")) is not None:
        return "succeeded", cond.get("message") or "trainer Job complete"
    if job.get("spec", {}).get("suspend"):
        return "suspended", "trainer Job suspended"
    # The Job's own deadline (the run's time left) fired: its pods die of it, not of a fault.
    for type_ in ("FailureTarget", "Failed"):
        if ((cond := job_condition(job, type_)) or {}).get("reason") == "DeadlineExceeded":
            return "deadline", f"trainer Job {cond.get('message') or 'passed its activeDeadlineSeconds'}"
    if ((cond := job_condition(job, "Failed")) or {}).get("reason") == "PodFailurePolicy":
        return "invalid", f"trainer Job failed: {cond.get('message') or 'a pod exited with code 2'}"
    failed = [p for p in pods if p.get("status", {}).get("phase") == "Failed"]
    if failed:
        for pod in pods:
            if (cond := disruption(pod)) is not None:
                detail = f"{cond.get('reason', 'DisruptionTarget')}: {cond.get('message', '')}".rstrip(": ")
                return "disrupted", f"pod {pod['metadata']['name']} was disrupted ({detail})"
        return "failed", pod_failure(failed[0])
    if (cond := job_condition(job, "Failed")) is not None:
        return "failed", f"trainer Job failed: {cond.get('reason', '')} {cond.get('message', '')}".strip()
    return "running", "trainer Job active"
