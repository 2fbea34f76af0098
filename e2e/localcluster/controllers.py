"""The local cluster's controllers: StatefulSet, Deployment, Job and the garbage collector,
each a level-triggered loop over the API (HTTP, every `poll_s`), as kube-controller-manager's
would be, only simpler.

- StatefulSet: pods `<sts>-<i>` (hostname `<sts>-<i>`, subdomain `serviceName`, labels
  `statefulset.kubernetes.io/pod-name`, `apps.kubernetes.io/pod-index`,
  `controller-revision-hash`); `Parallel` or `OrderedReady` creation; a deleted or finished
  pod is made again; scale down removes the highest ordinals; a template change replaces pods
  one at a time from the highest ordinal (RollingUpdate; `OnDelete` leaves them).
- Deployment: pods straight from the template (no ReplicaSet objects), named
  `<deploy>-<hash>-<random>` and labelled `pod-template-hash`; `Recreate` removes every old pod
  before making new ones, `RollingUpdate` makes the new ones first and removes the old ones
  once the new ones are ready.
- Job: `NonIndexed` and `Indexed` completion (pods `<job>-<i>-<random>`, hostname `<job>-<i>`,
  label and annotation `batch.kubernetes.io/job-completion-index`), `parallelism`,
  `completions`, `backoffLimit` (BackoffLimitExceeded), `podFailurePolicy` (FailJob, Ignore,
  Count on `onExitCodes` and `onPodConditions`), `podReplacementPolicy`, `suspend` (pods
  deleted, not counted as failures), `activeDeadlineSeconds`; status active, ready,
  succeeded, failed, terminating, completedIndexes and conditions Complete/Failed/Suspended.
  Not emulated: the back-off delay between pod failures, `backoffLimitPerIndex`,
  `successPolicy`, `ttlSecondsAfterFinished`, pod tracking finalizers (the counts live in this
  process).
- Garbage collector: an object whose owners (by uid) are all gone is deleted (background); an
  owner being deleted with the `foregroundDeletion` finalizer has its dependents deleted and
  loses the finalizer once no dependent with `blockOwnerDeletion` is left; `orphan` removes the
  owner's references from its dependents; objects of a deleted namespace are deleted.
"""

import asyncio
import hashlib
import json
import logging
import random

import aiohttp

from e2e.localcluster import resources
from e2e.localcluster.apiserver import now
from e2e.localcluster.client import Api

log = logging.getLogger(__name__)

INDEX = "batch.kubernetes.io/job-completion-index"
TERMINAL = ("Succeeded", "Failed")


# --- helpers ---------------------------------------------------------------------------------------

def owned_by(owner: dict, objs: list[dict]) -> list[dict]:
    uid = owner["metadata"]["uid"]
    return [o for o in objs if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])]


def owner_ref(owner: dict) -> dict:
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def template_hash(template: dict) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def suffix() -> str:
    return "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))


def new_pod(owner: dict, name: str, labels: dict | None = None, annotations: dict | None = None, **spec) -> dict:
    template = owner["spec"]["template"]
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": owner["metadata"]["namespace"],
                     "labels": {**(meta.get("labels") or {}), **(labels or {})},
                     "annotations": {**(meta.get("annotations") or {}), **(annotations or {})},
                     "ownerReferences": [owner_ref(owner)]},
        "spec": {**template["spec"], **spec},
    }


def phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "Pending")


def terminating(pod: dict) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def alive(pod: dict) -> bool:
    """Neither finished nor being deleted."""
    return phase(pod) not in TERMINAL and not terminating(pod)


def condition(kind: str, reason: str, message: str = "", status: str = "True") -> dict:
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastProbeTime": now(), "lastTransitionTime": now()}


def compress(indexes: set[int]) -> str:
    """`{0, 1, 2, 5}` → `"0-2,5"` (Job status.completedIndexes)."""
    out, run = [], []
    for i in sorted(indexes):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


# --- the controllers ------------------------------------------------------------------------------

class Controllers:
    """All controllers in one loop: each pass lists what they need once and reconciles."""

    def __init__(self, api_url: str, poll_s: float = 0.3, gc_every_s: float = 1.0):
        self.api = Api(api_url)
        self.poll_s, self.gc_every_s = poll_s, gc_every_s
        self._last_gc = 0.0
        self.jobs = JobController(self.api)
        self.pod_kind = self.api.kind("v1", "Pod")

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.sync()
                except (aiohttp.ClientError, OSError) as e:
                    log.warning("controllers: %s", e)
                await asyncio.sleep(self.poll_s)
        finally:
            await self.api.close()

    async def sync(self) -> None:
        pods = await self.api.list(self.pod_kind)
        for sts in await self.api.list(self.api.kind("apps/v1", "StatefulSet")):
            await statefulset(self.api, sts, owned_by(sts, pods))
        for deploy in await self.api.list(self.api.kind("apps/v1", "Deployment")):
            await deployment(self.api, deploy, owned_by(deploy, pods))
        for job in await self.api.list(self.api.kind("batch/v1", "Job")):
            await self.jobs.sync(job, owned_by(job, pods))
        if asyncio.get_running_loop().time() - self._last_gc >= self.gc_every_s:  # it lists every kind
            self._last_gc = asyncio.get_running_loop().time()
            await collect_garbage(self.api)


async def _update_status(api: Api, obj: dict, changes: dict) -> None:
    """Merge `changes` (None removes a field) into the status; written only when it changes."""
    merged = {**(obj.get("status") or {}), **changes, "observedGeneration": obj["metadata"].get("generation", 1)}
    if {k: v for k, v in merged.items() if v is not None} != (obj.get("status") or {}):
        await api.patch(obj, {"status": merged}, status=True)


async def statefulset(api: Api, sts: dict, pods: list[dict]) -> None:
    spec, name = sts["spec"], sts["metadata"]["name"]
    if sts["metadata"].get("deletionTimestamp"):
        return
    replicas, revision = spec.get("replicas", 1), f"{name}-{template_hash(spec['template'])}"
    by_name = {p["metadata"]["name"]: p for p in pods}
    ordered = spec.get("podManagementPolicy", "OrderedReady") == "OrderedReady"
    for i in range(replicas):
        pod_name, pod = f"{name}-{i}", by_name.get(f"{name}-{i}")
        if pod is None:
            labels = {"statefulset.kubernetes.io/pod-name": pod_name, "apps.kubernetes.io/pod-index": str(i),
                      "controller-revision-hash": revision}
            await api.create(new_pod(sts, pod_name, labels, hostname=pod_name, subdomain=spec.get("serviceName")))
            if ordered:
                break
        elif phase(pod) in TERMINAL and not terminating(pod):
            await api.delete(pod)  # made again on a later pass, once it is gone
        elif ordered and not (ready(pod) and alive(pod)):
            break
    for pod in pods:
        index = int(pod["metadata"]["labels"].get("apps.kubernetes.io/pod-index", -1))
        if index >= replicas and not terminating(pod):
            await api.delete(pod)
    current = [p for p in pods if alive(p)]
    stale = [p for p in current if p["metadata"]["labels"].get("controller-revision-hash") != revision]
    strategy = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate")
    if stale and strategy == "RollingUpdate" and all(ready(p) for p in current if p not in stale):
        await api.delete(max(stale, key=lambda p: int(p["metadata"]["labels"]["apps.kubernetes.io/pod-index"])))
    n_ready = sum(1 for p in current if ready(p))
    updated = len(current) - len(stale)
    await _update_status(api, sts, {"replicas": len(current), "readyReplicas": n_ready, "availableReplicas": n_ready,
                                    "currentReplicas": updated, "updatedReplicas": updated,
                                    "currentRevision": revision, "updateRevision": revision})


async def deployment(api: Api, deploy: dict, pods: list[dict]) -> None:
    spec, name = deploy["spec"], deploy["metadata"]["name"]
    if deploy["metadata"].get("deletionTimestamp"):
        return
    replicas, hash_ = spec.get("replicas", 1), template_hash(spec["template"])
    for pod in pods:
        if phase(pod) in TERMINAL and not terminating(pod):
            await api.delete(pod)
    current = [p for p in pods if alive(p)]
    new = [p for p in current if p["metadata"]["labels"].get("pod-template-hash") == hash_]
    old = [p for p in current if p not in new]
    recreate = (spec.get("strategy") or {}).get("type", "RollingUpdate") == "Recreate"
    if recreate and old:
        for pod in old:
            await api.delete(pod)
    elif recreate and any(p["metadata"]["labels"].get("pod-template-hash") != hash_ for p in pods):
        pass  # Recreate: old pods still terminating, new ones wait
    else:
        for _ in range(replicas - len(new)):
            await api.create(new_pod(deploy, f"{name}-{hash_}-{suffix()}", {"pod-template-hash": hash_}))
        for pod in sorted(new, key=lambda p: p["metadata"]["creationTimestamp"])[replicas:]:
            await api.delete(pod)
        if sum(1 for p in new if ready(p)) >= replicas:
            for pod in old:
                await api.delete(pod)
    n_ready = sum(1 for p in current if ready(p))
    available = n_ready >= replicas
    await _update_status(api, deploy, {
        "replicas": len(current), "readyReplicas": n_ready, "availableReplicas": n_ready,
        "updatedReplicas": len(new), "unavailableReplicas": max(0, replicas - n_ready),
        "conditions": [{"type": "Available", "status": "True" if available else "False",
                        "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable"}],
    })


class JobController:
    """Jobs need memory the pods do not carry: which finished pods were already counted, and
    which were deleted by a suspension (not failures). It lives here, keyed by the Job's uid."""

    def __init__(self, api: Api):
        self.api = api
        self.seen: dict[str, dict[str, dict]] = {}  # job uid -> pod uid -> last seen pod
        self.counted: dict[str, set[str]] = {}
        self.spared: dict[str, set[str]] = {}  # pods stopped by suspend or by the job's end

    async def sync(self, job: dict, pods: list[dict]) -> None:
        uid, spec, status = job["metadata"]["uid"], job["spec"], dict(job.get("status") or {})
        seen, counted, spared = self.seen.setdefault(uid, {}), self.counted.setdefault(uid, set()), \
            self.spared.setdefault(uid, set())
        finished = [c for c in status.get("conditions") or [] if c["type"] in ("Complete", "Failed")
                    and c["status"] == "True"]
        present = {p["metadata"]["uid"] for p in pods}
        ended = [p for p in pods if phase(p) in TERMINAL]
        ended += [p for pod_uid, p in seen.items() if pod_uid not in present and phase(p) != "Succeeded"]
        seen.clear()
        seen.update({p["metadata"]["uid"]: p for p in pods})
        policy = spec.get("podFailurePolicy")
        if not policy:  # without a podFailurePolicy a terminating pod is a failed pod at once
            ended += [p for p in pods if terminating(p) and phase(p) not in TERMINAL]
        succeeded, failed = status.get("succeeded", 0), status.get("failed", 0)
        done_indexes = _parse_indexes(status.get("completedIndexes", ""))
        fail_job = None
        for pod in ended:
            pod_uid = pod["metadata"]["uid"]
            if pod_uid in counted or pod_uid in spared:
                continue
            counted.add(pod_uid)
            if phase(pod) == "Succeeded":
                succeeded += 1
                if INDEX in pod["metadata"].get("annotations", {}):
                    done_indexes.add(int(pod["metadata"]["annotations"][INDEX]))
                continue
            action, why = _failure_action(policy, pod) if policy else ("Count", "")
            if action == "FailJob":
                fail_job = ("PodFailurePolicy", why)
            if action in ("Count", "FailJob", "FailIndex"):
                failed += 1
        if finished:
            for pod in pods:
                if alive(pod):
                    spared.add(pod["metadata"]["uid"])
                    await self.api.delete(pod)
            return
        indexed = spec.get("completionMode", "NonIndexed") == "Indexed"
        completions = spec.get("completions")
        parallelism = spec.get("parallelism", 1)
        active = [p for p in pods if alive(p)]
        conditions = list(status.get("conditions") or [])
        new_status = {"startTime": status.get("startTime")}
        deadline = spec.get("activeDeadlineSeconds")
        if fail_job is None and failed > spec.get("backoffLimit", 6):
            fail_job = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if fail_job is None and deadline and status.get("startTime") and not spec.get("suspend") and \
                resources.seconds_since(status["startTime"]) > deadline:
            fail_job = ("DeadlineExceeded", "Job was active longer than specified deadline")
        complete = (len(done_indexes) >= completions if indexed else
                    succeeded >= completions if completions is not None else succeeded > 0 and not active)
        if fail_job or complete:
            for pod in active:
                spared.add(pod["metadata"]["uid"])
                await self.api.delete(pod)
            active = []
            if fail_job:
                conditions += [condition("FailureTarget", *fail_job), condition("Failed", *fail_job)]
            else:
                conditions += [condition("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of "
                                         "succeeded pods"), condition("Complete", "CompletionsReached",
                                                                       "Reached expected number of succeeded pods")]
                new_status["completionTime"] = now()
        elif spec.get("suspend"):
            for pod in active:
                spared.add(pod["metadata"]["uid"])
                await self.api.delete(pod)
            active = []
            _set_condition(conditions, condition("Suspended", "JobSuspended", "Job suspended"))
            new_status["startTime"] = None
        else:
            if any(c["type"] == "Suspended" for c in conditions):
                _set_condition(conditions, condition("Suspended", "JobResumed", "Job resumed", status="False"))
            new_status["startTime"] = status.get("startTime") or now()
            active += await self._start_pods(job, pods, active, done_indexes, succeeded, indexed, parallelism)
        await _update_status(self.api, job, new_status | {
            "active": len(active), "ready": sum(1 for p in active if ready(p)), "succeeded": succeeded,
            "failed": failed, "terminating": sum(1 for p in pods if terminating(p) and phase(p) not in TERMINAL),
            "conditions": conditions, **({"completedIndexes": compress(done_indexes)} if indexed else {}),
        })

    async def _start_pods(self, job, pods, active, done_indexes, succeeded, indexed, parallelism) -> list[dict]:
        spec, name = job["spec"], job["metadata"]["name"]
        replace_when_failed = spec.get("podReplacementPolicy") == "Failed" or spec.get("podFailurePolicy")
        waiting = [p for p in pods if terminating(p) and phase(p) not in TERMINAL] if replace_when_failed else []
        labels = {"batch.kubernetes.io/controller-uid": job["metadata"]["uid"], "controller-uid": job["metadata"]["uid"],
                  "batch.kubernetes.io/job-name": name, "job-name": name}
        made = []
        if indexed:
            busy = {int(p["metadata"]["annotations"][INDEX]) for p in active + waiting}
            todo = [i for i in range(spec["completions"]) if i not in done_indexes and i not in busy]
            for i in todo[:max(0, parallelism - len(active))]:
                pod = new_pod(job, f"{name}-{i}-{suffix()}", labels | {INDEX: str(i)}, {INDEX: str(i)},
                              hostname=f"{name}-{i}", subdomain=spec["template"]["spec"].get("subdomain"))
                for c in pod["spec"]["containers"]:
                    c["env"] = [*(c.get("env") or []), {"name": "JOB_COMPLETION_INDEX", "valueFrom": {
                        "fieldRef": {"fieldPath": f"metadata.annotations['{INDEX}']"}}}]
                made.append(pod)
        else:
            remaining = spec["completions"] - succeeded if spec.get("completions") is not None else parallelism
            for _ in range(max(0, min(parallelism, remaining) - len(active) - len(waiting))):
                made.append(new_pod(job, f"{name}-{suffix()}", labels))
        for pod in made:
            await self.api.create(pod)
        return made


def _set_condition(conditions: list[dict], new: dict) -> None:
    """Replace the condition of the same type unless its status is already the same."""
    old = next((c for c in conditions if c["type"] == new["type"]), None)
    if old is None or old["status"] != new["status"]:
        conditions[:] = [c for c in conditions if c["type"] != new["type"]] + [new]


def _parse_indexes(text: str) -> set[int]:
    out = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _failure_action(policy: dict, pod: dict) -> tuple[str, str]:
    """The action of the first podFailurePolicy rule matching a failed pod (Count when none),
    and why, in the Job controller's words (its `PodFailurePolicy` condition message)."""
    status, meta = pod.get("status") or {}, pod["metadata"]
    where = f"{meta.get('namespace')}/{meta['name']}"
    for index, rule in enumerate(policy.get("rules") or []):
        if on_codes := rule.get("onExitCodes"):
            for c in status.get("containerStatuses") or []:
                code = ((c.get("state") or {}).get("terminated") or {}).get("exitCode", 0)
                if code == 0 or on_codes.get("containerName") not in (None, c["name"]):
                    continue
                if (code in on_codes["values"]) == (on_codes["operator"] == "In"):
                    return rule["action"], (f"Container {c['name']} for pod {where} failed with exit code {code} "
                                            f"matching {rule['action']} rule at index {index}")
        for pattern in rule.get("onPodConditions") or []:
            if any(c.get("type") == pattern["type"] and c.get("status") == pattern.get("status", "True")
                   for c in status.get("conditions") or []):
                return rule["action"], (f"Pod {where} has condition {pattern['type']} matching {rule['action']} "
                                        f"rule at index {index}")
    return "Count", ""


# --- garbage collection ---------------------------------------------------------------------------

async def collect_garbage(api: Api) -> None:
    objects = []
    for kind in api.kinds:
        if kind.kind != "Event":
            objects += await api.list(kind)
    uids = {o["metadata"]["uid"] for o in objects}
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    for obj in objects:
        meta = obj["metadata"]
        refs = meta.get("ownerReferences") or []
        orphaned = refs and not any(r["uid"] in uids for r in refs) and await _owners_gone(api, obj)
        homeless = meta.get("namespace") and meta["namespace"] not in namespaces and \
            await api.get(api.kind("v1", "Namespace"), None, meta["namespace"]) is None
        if (orphaned or homeless) and not meta.get("deletionTimestamp"):
            log.info("garbage collector: deleting %s %s/%s", obj["kind"], meta.get("namespace"), meta["name"])
            await api.delete(obj)
        finalizers = meta.get("finalizers") or []
        if meta.get("deletionTimestamp") and ("foregroundDeletion" in finalizers or "orphan" in finalizers):
            await _finish_deletion(api, obj, owned_by(obj, objects))


async def _owners_gone(api: Api, obj: dict) -> bool:
    """Check the owners against the API itself: the lists the collector works from were taken
    one after the other, and an owner made meanwhile is in none of them. (Likewise for the
    namespace, above.)"""
    meta = obj["metadata"]
    for ref in meta.get("ownerReferences") or []:
        kind = api.kind(ref["apiVersion"], ref["kind"])
        owner = await api.get(kind, meta.get("namespace"), ref["name"]) if kind else None
        if owner is not None and owner["metadata"]["uid"] == ref["uid"]:
            return False
    return True


async def _finish_deletion(api: Api, owner: dict, dependents: list[dict]) -> None:
    finalizers = owner["metadata"]["finalizers"]
    uid = owner["metadata"]["uid"]
    if "orphan" in finalizers:
        for dep in dependents:
            refs = [r for r in dep["metadata"]["ownerReferences"] if r["uid"] != uid]
            await api.patch(dep, {"metadata": {"ownerReferences": refs or None}})
        finalizers = [f for f in finalizers if f != "orphan"]
    else:
        for dep in dependents:
            if not dep["metadata"].get("deletionTimestamp"):
                await api.delete(dep, policy="Foreground")
        if any(r.get("uid") == uid and r.get("blockOwnerDeletion")
               for dep in dependents for r in dep["metadata"]["ownerReferences"]):
            return
        finalizers = [f for f in finalizers if f != "foregroundDeletion"]
    await api.patch(owner, {"metadata": {"finalizers": finalizers or None}})

