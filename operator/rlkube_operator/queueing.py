"""Queueing: the run waits, as one unit, for whoever hands out the cluster's capacity.

Two ways a run is held without being suspended by its user:

- Someone else suspends its trainer Job (a queue controller, an admin). The operator gives a
  Job's `spec.suspend` a value only when the run's own `suspend` changed since it last did
  (the value it gave is on the Job, `rlkube.dev/suspend`, so the pass stays stateless): it
  never fights that suspension, reports the run Pending (`Queued`), and when the Job is
  released the trainer just runs, as the same attempt.
- `spec.queue` names a Kueue LocalQueue: the run is one Kueue `Workload` (Kueue's integration
  for workloads it does not know: the controller creates the Workload, starts when it is
  admitted, stops when it is evicted and marks it Finished), one podSet per component.
  Until admitted the run has no pods and its deadline clock does not start; evicted, it
  scales to zero without spending its `backoffLimit` and resumes from the latest checkpoint
  when admitted again. Admitted, each component's pods get the node labels (as nodeSelector)
  and tolerations of the ResourceFlavors Kueue assigned its podSet, so they land where the
  quota was taken; evicted or suspended, they get the user's scheduling back (Kueue's
  jobframework `RunWithPodSetsInfo` and `RestorePodSetsInfo`). The `kueue.x-k8s.io/queue-name`
  label on the run names the LocalQueue too, as on Kueue's own job kinds.

And a run whose `scheduling.schedulerName` is a gang scheduler gets its PodGroup (`gang.py`).
"""

import functools
import json
import logging
from dataclasses import dataclass, field, replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from rlkube_operator import builders, gang, pods
from rlkube_operator.conditions import set_condition
from rlkube_operator.kube import MERGE_PATCH, ForeignChild, Kube, json_body
from rlkube_operator.names import RunRef, controller_uid
from rlkube_operator.poolspec import RLPoolSpec
from rlkube_operator.spec import SERVED_MODELS, QueueSpec, RLRunSpec, RunSpecBase

log = logging.getLogger(__name__)

KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta1"
QUEUE_LABEL = f"{KUEUE_GROUP}/queue-name"
WORKLOAD_PRIORITY_SOURCE = f"{KUEUE_GROUP}/workloadpriorityclass"
PLACEMENT_ANNOTATION = "rlkube.dev/placement"
"""On the Workload: the flavours its admission assigned, the scheduling they give each podSet,
and every node label key ever put on the run's pods (so the user's selector can be restored)."""
COMPONENT_LABEL = "app.kubernetes.io/component"


# --- the trainer Job's suspend ------------------------------------------------------------
def _last_applied_suspend(job: dict) -> bool | None:
    """What the operator last set the Job's `spec.suspend` to; None on a Job made before it said."""
    value = (job.get("metadata", {}).get("annotations") or {}).get(builders.SUSPEND_ANNOTATION)
    return None if value is None else value == "true"


def suspend_patch(job: dict, suspend: bool) -> dict | None:
    """The merge patch that carries the run's `suspend` to its trainer Job, or None: only a
    change of the run's own suspend is applied, so a suspension (or release) made by someone
    else since stays. A Job from before the annotation is annotated with its current value."""
    last = _last_applied_suspend(job)
    current = bool(job.get("spec", {}).get("suspend"))
    if last == suspend:
        return None
    patch: dict = {"metadata": {"annotations": {builders.SUSPEND_ANNOTATION: str(suspend).lower()}}}
    if (current if last is None else last) != suspend:
        patch["spec"] = {"suspend": suspend}
    return patch


def suspended_from_outside(job: dict | None) -> str | None:
    """Why the trainer Job is suspended though the operator last left it running (None if it is
    not): naming the field manager that owns its `spec.suspend` now, the one that set it."""
    if job is None or not job.get("spec", {}).get("suspend") or _last_applied_suspend(job) is not False:
        return None
    managers = [m.get("manager") for m in job["metadata"].get("managedFields") or []
                if "f:suspend" in ((m.get("fieldsV1") or {}).get("f:spec") or {})]
    who = ", ".join(m for m in managers if m) or "another controller or a user"
    return f"trainer Job {job['metadata']['name']} suspended by {who}; it runs when released"


# --- Kueue ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Admission:
    """Where the run's Kueue Workload stands."""

    admitted: bool
    message: str
    """Why the run waits (empty when admitted)."""

    evicted: bool = False
    """Kueue evicted it and still holds its quota until the run has stopped."""

    workload: dict = field(default_factory=dict, compare=False)
    """The Workload as read: what the status writes (`Kueue.release`, `Kueue.finish`) start from."""

    placement: dict = field(default_factory=dict, compare=False)
    """podSet → {"nodeSelector", "tolerations"} of its assigned flavours, while admitted."""

    placed_labels: tuple[str, ...] = ()
    """Every node label key a placement has put on the run's pods (to take off when restoring)."""


def _condition(obj: dict, type_: str) -> dict | None:
    return next((c for c in _conditions(obj) if c.get("type") == type_ and c.get("status") == "True"), None)


def admission(wl: dict) -> Admission:
    """Read Kueue's verdict: admitted (quota reserved and every admission check passed),
    evicted (preempted, deactivated, a check retracted: Kueue waits for the run to stop), or
    pending, with Kueue's own message (`couldn't assign flavors to pod set trainer: …`)."""
    name, queue = wl["metadata"]["name"], wl["spec"].get("queueName")
    reserved = _condition(wl, "QuotaReserved")
    if _condition(wl, "Finished") is not None:
        return Admission(True, "", workload=wl)
    if (evicted := _condition(wl, "Evicted")) is not None and reserved is not None:
        why = f"{evicted.get('reason', 'Evicted')}: {evicted.get('message', '')}".rstrip(": ")
        return Admission(False, f"Kueue evicted Workload {name} ({why}); it resumes from the latest "
                                "checkpoint when admitted again", evicted=True, workload=wl)
    if _condition(wl, "Admitted") is not None and reserved is not None:
        return Admission(True, "", workload=wl)
    pending = next((c for c in _conditions(wl) if c.get("type") == "QuotaReserved" and c.get("message")), None)
    detail = f": {pending['message']}" if pending else ""
    return Admission(False, f"Workload {name} waits for Kueue to admit it (LocalQueue {queue}){detail}",
                     workload=wl)


def queue_from_label(spec: RunSpecBase, labels: dict | None) -> RunSpecBase:
    """The spec with its queue named by the run's `kueue.x-k8s.io/queue-name` label, Kueue's way
    of naming a job's LocalQueue, when `spec.queue` names none; ValueError when both name one
    and they differ."""
    name = (labels or {}).get(QUEUE_LABEL)
    if not name or (spec.queue is not None and spec.queue.name == name):
        return spec
    if spec.queue is not None:
        raise ValueError(f"spec.queue.name is {spec.queue.name!r} but the label {QUEUE_LABEL} is {name!r}: "
                         "give the LocalQueue once, or the same in both")
    return spec.model_copy(update={"queue": QueueSpec(name=name)})


def place(obj: dict, queued: Admission | None) -> dict:
    """`obj` (a component's StatefulSet, Deployment or Job) with its pod template scheduled as
    the run's admission says: its podSet's flavours' node labels over its nodeSelector and their
    tolerations after its own while admitted; not admitted, the user's scheduling, with the
    node labels a placement added nulled (a merge patch keeps map keys it does not name, and
    replaces lists whole). A new Job is made from the user's template: never nulls in it."""
    if queued is None:
        return obj
    pod = obj["spec"]["template"]["spec"]
    component = obj["spec"]["template"]["metadata"]["labels"][COMPONENT_LABEL]
    if (placed := queued.placement.get(component)) is not None:
        pod["nodeSelector"] = (pod.get("nodeSelector") or {}) | placed["nodeSelector"]
        own = pod.get("tolerations") or []
        if tolerations := own + [t for t in placed["tolerations"] if t not in own]:
            pod["tolerations"] = tolerations
    elif queued.placed_labels and obj["kind"] != "Job":
        selector = pod.get("nodeSelector") or {}
        pod["nodeSelector"] = {key: None for key in queued.placed_labels} | selector
        pod.setdefault("tolerations", None)
    return obj


def component_pods(spec: RunSpecBase) -> dict[str, int]:
    """How many pods each component of the run has when it runs: a pool member's are its
    orchestrator and env workers, a pool's its inference and trainer."""
    counts = {}
    if isinstance(spec, RLRunSpec):
        counts = {"orchestrator": 1} if spec.member else {"inference": spec.inference.replicas, "orchestrator": 1}
        if spec.env_workers.replicas:
            counts["env-worker"] = spec.env_workers.replicas
        if spec.member:
            return counts
        counts |= {name: served.replicas for name, served in spec.served_models().items()}
    elif isinstance(spec, RLPoolSpec):
        counts = {"inference": spec.inference.replicas}
    return counts | {"trainer": spec.trainer.nodes}


def pod_sets(run: RunRef, spec: RunSpecBase, trainer_job: dict) -> list[dict]:
    """One podSet per component, with the templates (and so the resources) its pods get."""
    owners = {"trainer": lambda: trainer_job,
              "inference": lambda: builders.build_inference_statefulset(run, spec, 0),
              "orchestrator": lambda: builders.build_orchestrator_deployment(run, spec, 0, 0),
              "env-worker": lambda: builders.build_env_worker_deployment(run, spec, 0),
              **{name: functools.partial(builders.build_served_statefulset, run, spec, name, 0)
                 for name in SERVED_MODELS}}
    return [{"name": component, "count": count, "template": owners[component]()["spec"]["template"]}
            for component, count in component_pods(spec).items()]


def quota_shape(wl: dict) -> list[tuple]:
    """What Kueue counts of the Workload's podSets: each one's name, count and the resources
    its pod template asks, per container. A request defaults to its limit and quantities are
    compared by value (`"1000m"` is `1`), so Kueue's defaulting or canonical forms of the same
    template never read as a change."""
    return [(s["name"], s["count"], _template_requests(s["template"])) for s in wl["spec"]["podSets"]]


def _template_requests(template: dict) -> tuple:
    pod = template.get("spec") or {}
    containers = [c for kind in ("initContainers", "containers") for c in pod.get(kind) or []]
    return (tuple((c["name"], _requests(c.get("resources") or {})) for c in containers),
            _quantities(pod.get("overhead") or {}))


def _requests(resources: dict) -> dict:
    return _quantities((resources.get("limits") or {}) | (resources.get("requests") or {}))


def _quantities(amounts: dict) -> dict:
    return {name: parse_quantity(amount) for name, amount in amounts.items()}


def _sizes(wl: dict) -> str:
    return ", ".join(f"{s['name']}×{s['count']}" for s in wl["spec"]["podSets"])


def build_pod_group(run: RunRef, spec: RunSpecBase) -> dict | None:
    """The run's PodGroup when its `scheduling.schedulerName` is a gang scheduler (None
    otherwise): `minMember` counts every pod that scheduler places, so none starts before all
    of them fit."""
    scheduler = spec.scheduling.scheduler_name
    kind = gang.GANG_SCHEDULERS.get(scheduler or "")
    if kind is None:
        return None
    members = sum(count for component, count in component_pods(spec).items()
                  if pods.pod_settings(spec, component).scheduler_name == scheduler)
    return {"apiVersion": kind.api_version, "kind": "PodGroup",
            "metadata": run.metadata("pod-group", gang.pod_group_name(run)), "spec": {"minMember": members}}


def build_workload(run: RunRef, spec: RunSpecBase, trainer_job: dict) -> dict:
    """The run as one Kueue Workload, owned by the run (it goes with it), in `spec.queue`'s
    LocalQueue; inactive while the run is suspended, which releases its quota."""
    queue = spec.queue
    metadata = run.metadata("workload")
    metadata["labels"] = metadata.get("labels", {}) | {QUEUE_LABEL: queue.name}
    wl_spec = {"queueName": queue.name, "active": not spec.suspend,
               "podSets": pod_sets(run, spec, trainer_job)}
    if queue.priority_class_name:
        wl_spec |= {"priorityClassName": queue.priority_class_name, "priorityClassSource": WORKLOAD_PRIORITY_SOURCE}
    return {"apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}", "kind": "Workload", "metadata": metadata,
            "spec": wl_spec}


class CustomObjects:
    """Objects of kinds the operator does not own the API of (Kueue's Workloads, PodGroups),
    through the custom-objects API: as `Kube`, only those the run controls."""

    def __init__(self, kube: Kube):
        self._kube = kube

    @property
    def _api(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self._kube.api_client)  # on use: runs without a queue never need it

    def get_or_create(self, run: RunRef, plural: str, desired: dict) -> dict:
        """The run's object under `desired`'s name, created from `desired` when missing."""
        group, version = desired["apiVersion"].split("/")
        name = desired["metadata"]["name"]
        try:
            obj = json_body(self._api.get_namespaced_custom_object(group, version, run.namespace, plural, name,
                                                               _preload_content=False))
        except ApiException as e:
            if e.status != 404:
                raise
            obj = json_body(self._api.create_namespaced_custom_object(group, version, run.namespace, plural, desired,
                                                                  _preload_content=False))
            log.info("created %s %s/%s", desired["kind"], run.namespace, name)
        if controller_uid(obj) != run.uid:
            raise ForeignChild({"kind": desired["kind"]} | obj)
        return obj

    def get_cluster_scoped(self, group: str, version: str, plural: str, name: str) -> dict | None:
        """A cluster-scoped object (a Kueue ResourceFlavor); None when there is none."""
        try:
            return json_body(self._api.get_cluster_custom_object(group, version, plural, name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def patch(self, obj: dict, plural: str, patch: dict, status: bool = False) -> dict:
        group, version = obj["apiVersion"].split("/")
        method = self._api.patch_namespaced_custom_object_status if status else self._api.patch_namespaced_custom_object
        meta = obj["metadata"]
        return json_body(method(group, version, meta["namespace"], plural, meta["name"], patch,
                            _content_type=MERGE_PATCH, _preload_content=False))

    def replace(self, obj: dict, plural: str, desired: dict) -> dict | None:
        """Delete `obj`, that very object (its uid a precondition: never a newer one under its
        name), and create `desired` in its place. None while the name is still taken (the old
        object waits on a finalizer, or another one was made meanwhile): a later pass retries."""
        group, version = obj["apiVersion"].split("/")
        meta = obj["metadata"]
        body = {"propagationPolicy": "Background", "preconditions": {"uid": meta["uid"]}}
        try:
            self._api.delete_namespaced_custom_object(group, version, meta["namespace"], plural, meta["name"],
                                                      body=body, _preload_content=False)
        except ApiException as e:
            if e.status not in (404, 409):  # gone already, or another object under the name
                raise
        try:
            return json_body(self._api.create_namespaced_custom_object(group, version, meta["namespace"], plural,
                                                                       desired, _preload_content=False))
        except ApiException as e:
            if e.status != 409:
                raise
            return None


class Kueue:
    """The Workload calls: create (and replace, resized), `spec.active`, and the two status
    writes Kueue leaves to a workload's controller."""

    def __init__(self, objects: CustomObjects):
        self._objects = objects

    def ensure(self, run: RunRef, desired: dict) -> Admission:
        """Create the run's Workload, keep `spec.active` in step with the run's suspend, and
        read its admission. Its podSets are immutable: a run resized while suspended gets a new
        Workload (`_resize`), so Kueue counts what the run will really run."""
        wl = self._objects.get_or_create(run, "workloads", desired)
        record = json.loads((wl["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION) or "{}")
        placed = tuple(record.get("nodeLabels", ()))
        if _condition(wl, "Finished") is None and quota_shape(wl) != quota_shape(desired):
            return replace(self._resize(wl, desired), placed_labels=placed)
        read = admission(self._activate(wl, desired["spec"]["active"]))
        assigned = _assigned_flavors(read.workload)
        if not read.admitted or not assigned or _condition(read.workload, "Finished") is not None:
            return replace(read, placed_labels=placed)
        if record.get("flavors") != assigned:  # a new admission: read its flavours once
            placement, missing = self._placement(assigned)
            if missing:
                return replace(read, admitted=False, placed_labels=placed,
                               message=f"Workload {read.workload['metadata']['name']} is admitted on "
                                       f"ResourceFlavor {missing}, which does not exist: its pods would not "
                                       "land where Kueue counted them")
            keys = sorted({*placed, *(k for p in placement.values() for k in p["nodeSelector"])})
            record = {"flavors": assigned, "podSets": placement, "nodeLabels": keys}
            self._objects.patch(read.workload, "workloads",
                                {"metadata": {"annotations": {PLACEMENT_ANNOTATION: json.dumps(record, sort_keys=True)}}})
        return replace(read, placement=record["podSets"], placed_labels=tuple(record["nodeLabels"]))

    def _placement(self, assigned: dict[str, list[str]]) -> tuple[dict, str | None]:
        """podSet → the nodeSelector and tolerations of its flavours (Kueue's
        `podset.FromAssignment`: every flavour's `nodeLabels` and `tolerations`), and the name of
        a flavour that does not exist (None when all do)."""
        flavors = {}
        for name in sorted({f for names in assigned.values() for f in names}):
            flavor = self._objects.get_cluster_scoped(KUEUE_GROUP, KUEUE_VERSION, "resourceflavors", name)
            if flavor is None:
                return {}, name
            flavors[name] = flavor.get("spec") or {}
        placement = {}
        for pod_set, names in assigned.items():
            selector, tolerations = {}, []
            for name in names:
                selector |= flavors[name].get("nodeLabels") or {}
                tolerations += [t for t in flavors[name].get("tolerations") or [] if t not in tolerations]
            placement[pod_set] = {"nodeSelector": selector, "tolerations": tolerations}
        return placement, None

    def _resize(self, wl: dict, desired: dict) -> Admission:
        """Replace a Workload whose podSets no longer match the run, as Kueue's own job
        integrations do, but only once it holds no quota: until then it is deactivated, so
        Kueue evicts it (the run stops, then releases it as after any eviction)."""
        name = wl["metadata"]["name"]
        if _condition(wl, "QuotaReserved") is not None or (wl.get("status") or {}).get("admission"):
            read = admission(self._activate(wl, False))
            return Admission(False, f"Workload {name} still holds quota for the run's former size ({_sizes(wl)}); "
                                    "it is recreated for the new size once Kueue releases it",
                             evicted=read.evicted, workload=read.workload)
        log.info("recreating Workload %s/%s: podSets %s, now %s", wl["metadata"]["namespace"], name,
                 _sizes(wl), _sizes(desired))
        created = self._objects.replace(wl, "workloads", desired)
        if created is None:
            return Admission(False, f"Workload {name} is being replaced for the run's new size ({_sizes(desired)})",
                             workload=wl)
        return admission(created)

    def _activate(self, wl: dict, active: bool) -> dict:
        if wl["spec"].get("active", True) != active:
            wl = self._objects.patch(wl, "workloads", {"spec": {"active": active}})
        return wl

    def release(self, wl: dict, now: str) -> None:
        """After an eviction the run has stopped: give the quota back (Kueue requeues the
        Workload), as Kueue's own job integrations do."""
        why = (_condition(wl, "Evicted") or {}).get("message", "evicted")
        conditions = _set_condition(_conditions(wl), wl, "QuotaReserved", False, "Pending", why, now)
        conditions = _set_condition(conditions, wl, "Admitted", False, "NoReservation",
                                    "the workload has no reservation", now)
        self._objects.patch(wl, "workloads", {"status": {"admission": None, "conditions": conditions}}, status=True)

    def finish(self, wl: dict, phase: str, message: str, now: str) -> None:
        """Mark the Workload Finished (once): Kueue frees its quota for the next in line."""
        if _condition(wl, "Finished") is None:
            conditions = _set_condition(_conditions(wl), wl, "Finished", True, phase, message or phase, now)
            self._objects.patch(wl, "workloads", {"status": {"conditions": conditions}}, status=True)


def ensure_pod_group(objects: CustomObjects, run: RunRef, desired: dict) -> None:
    """Create the run's PodGroup, and keep its `minMember` to the run's size (replicas may
    change while the run is suspended)."""
    group = objects.get_or_create(run, "podgroups", desired)
    if group.get("spec", {}).get("minMember") != desired["spec"]["minMember"]:
        objects.patch(group, "podgroups", {"spec": {"minMember": desired["spec"]["minMember"]}})


def _assigned_flavors(wl: dict) -> dict[str, list[str]]:
    """podSet → the ResourceFlavors its admission assigned (over all its resources), sorted."""
    assignments = ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    return {a["name"]: sorted(set((a.get("flavors") or {}).values())) for a in assignments}


def _conditions(wl: dict) -> list[dict]:
    return (wl.get("status") or {}).get("conditions") or []


def _set_condition(conditions: list[dict], wl: dict, type_: str, ok: bool, reason: str, message: str,
                   now: str) -> list[dict]:
    """`conditions` with `type_` set, for the Workload's generation (a merge patch replaces the
    whole list; a condition's message is at most 32768 characters)."""
    return set_condition(conditions, type_, ok, reason, message[:32768],
                         generation=wl["metadata"].get("generation"), now=now)
