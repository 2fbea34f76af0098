"""Gang scheduling: the PodGroup kinds of the gang schedulers the operator knows, and the mark
that puts a pod in its run's group (pure; `queueing.build_pod_group` makes the group).

A run's pods are only useful together (the trainer waits for the orchestrator, which waits for
inference): a gang scheduler places all of them or none, instead of some pods holding GPUs
while the rest wait."""

from dataclasses import dataclass

from rlkube_operator.names import RunRef


@dataclass(frozen=True)
class PodGroupKind:
    api_version: str
    member_key: str
    """The pod label or annotation that names the pod's group."""

    member_is_label: bool


VOLCANO = PodGroupKind("scheduling.volcano.sh/v1beta1", "scheduling.k8s.io/group-name", member_is_label=False)
COSCHEDULING = PodGroupKind("scheduling.x-k8s.io/v1alpha1", "scheduling.x-k8s.io/pod-group", member_is_label=True)
GANG_SCHEDULERS = {"volcano": VOLCANO, "scheduler-plugins-scheduler": COSCHEDULING}
"""schedulerName → its PodGroup: Volcano's, and the scheduler-plugins coscheduling plugin's
(installed as a second scheduler under that name)."""


def pod_group_name(run: RunRef) -> str:
    return run.child("pod-group")


def pod_marks(run: RunRef, scheduler_name: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(labels, annotations) that put a pod scheduled by `scheduler_name` in its run's group."""
    kind = GANG_SCHEDULERS.get(scheduler_name or "")
    if kind is None:
        return {}, {}
    mark = {kind.member_key: pod_group_name(run)}
    return (mark, {}) if kind.member_is_label else ({}, mark)
