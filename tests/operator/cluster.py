"""The local cluster's API server (e2e/localcluster/apiserver.py) for in-process operator tests,
plus helpers that play the parts of the controllers (StatefulSet/Deployment/Job creating pods,
the kubelet reporting their status) as each test needs them."""

import asyncio
import contextvars
import copy
import json
import sys
from typing import Self

from e2e.localcluster import apiserver
from e2e.localcluster.client import Api
from e2e.localcluster.resources import Kind

NS = "team-a"
# Kinds the operator writes that the local cluster does not serve (no Kueue, no gang scheduler
# runs there): stored as sent, as a cluster with those CRDs installed would.
SCHEDULING = (
    Kind("kueue.x-k8s.io", "v1beta1", "workloads", "Workload", subresources=("status",)),
    Kind("kueue.x-k8s.io", "v1beta1", "resourceflavors", "ResourceFlavor", namespaced=False),
    Kind("scheduling.volcano.sh", "v1beta1", "podgroups", "PodGroup", subresources=("status",)),
    Kind("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup", subresources=("status",)),
)
PATHS = {
    "RLRun": "rlkube.dev/v1alpha1/rlruns", "SFTRun": "rlkube.dev/v1alpha1/sftruns", "RLPool": "rlkube.dev/v1alpha1/rlpools",
    "ConfigMap": "v1/configmaps", "Secret": "v1/secrets", "Service": "v1/services",
    "PersistentVolumeClaim": "v1/persistentvolumeclaims", "Pod": "v1/pods", "Event": "v1/events",
    "StatefulSet": "apps/v1/statefulsets", "Deployment": "apps/v1/deployments", "Job": "batch/v1/jobs",
    "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "NetworkPolicy": "networking.k8s.io/v1/networkpolicies", "Lease": "coordination.k8s.io/v1/leases",
    "Workload": "kueue.x-k8s.io/v1beta1/workloads", "ResourceFlavor": "kueue.x-k8s.io/v1beta1/resourceflavors",
    "volcano PodGroup": "scheduling.volcano.sh/v1beta1/podgroups",
    "coscheduling PodGroup": "scheduling.x-k8s.io/v1alpha1/podgroups",
}
AGENT = "rlkube-tests"  # the User-Agent of a test's own requests, left out where the operator's are counted
_SERVING: contextvars.ContextVar = contextvars.ContextVar("the request being served", default=None)


class ApiServer(apiserver.ApiServer):
    """The local cluster's API server (e2e/localcluster: CEL rules with `oldSelf`, immutable
    fields, the status subresource, graceful pod deletion), serving the scheduling kinds too,
    with namespace `NS` made; requests are kept parsed as kmock parses them, so tests can count
    the operator's by verb and resource.

    Each request costs the same however many came before it. kmock picks a request's reaction
    by asking each reaction's filters whether the request is among those they see, which walks
    every request served so far: 0.4 s a request after 1,150 of them (2-core VM). While a
    reaction is picked the server's requests are that request alone, so the filters decide on
    it alone, as they would in the whole log; tests reading the log see all of it. Reactions
    that depend on the order of requests (kmock's slices, `server[...][:1]`) would see only it:
    none are used here."""

    extra_kinds = SCHEDULING
    parse_requests = True
    keep_requests = sys.maxsize  # tests count requests since a mark (`embedded.served`)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        namespace = {"apiVersion": "v1", "kind": "Namespace",
                     "metadata": {"name": NS, "uid": NS, "creationTimestamp": apiserver.now()}}
        self._store(self.kinds["", "v1", "namespaces"], namespace, "ADDED")

    def __iter__(self):
        serving = _SERVING.get()
        if serving is None:
            yield from super().__iter__()
        else:
            yield serving

    async def _react(self, request):
        serving = _SERVING.set(request)
        try:
            return await super()._react(request)
        finally:
            _SERVING.reset(serving)


class Cluster:
    """What a test does to the cluster, through the API server's HTTP API (so watches fire) with
    the local cluster's own client; what it reads, from the server's store."""

    def __init__(self, server: ApiServer):
        self.server = server
        self.api = Api(str(server.url), kinds=server.kinds.values(), agent=AGENT)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.api.close()

    def kind(self, kind: str) -> Kind:
        group_version, plural = PATHS[kind].rsplit("/", 1)
        group, _, version = group_version.rpartition("/")
        return self.server.kinds[group, version, plural]

    def url(self, kind: str, name: str | None = None, namespace: str = NS) -> str:
        return self.kind(kind).url(namespace, name)

    async def _call(self, method: str, path: str, body) -> dict:
        content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
        status, answer = await self.api.request(method, path, body, content_type)
        assert status < 300, answer
        return answer

    async def create(self, obj: dict) -> dict:
        """Create `obj`; a `status` in it is then written as its controller would (to `/status`)."""
        obj = copy.deepcopy(obj)
        kind = self.api.kind(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"].setdefault("namespace", NS) if kind.namespaced else None
        created = await self._call("POST", kind.url(namespace), obj)
        if obj.get("status") and "status" in kind.subresources:
            path = kind.url(namespace, created["metadata"]["name"]) + "/status"
            return await self._call("PATCH", path, {"status": obj["status"]})
        return created

    async def patch(self, kind: str, name: str, patch: dict) -> dict:
        """A merge patch; its `status` goes to the status subresource, the rest to the object."""
        patch = dict(patch)
        status = {"status": patch.pop("status")} if "status" in patch else None
        result = await self._call("PATCH", self.url(kind, name), patch) if patch or status is None else None
        if status is not None:
            result = await self._call("PATCH", self.url(kind, name) + "/status", status)
        return result

    async def delete(self, kind: str, name: str) -> None:
        await self._call("DELETE", self.url(kind, name), None)

    def get(self, kind: str, name: str) -> dict | None:
        obj = self.server.read(self.kind(kind), NS, name)
        return copy.deepcopy(obj) if obj is not None else None

    def names(self, kind: str) -> set[str]:
        return {obj["metadata"]["name"] for obj in self.server.read_all(self.kind(kind), NS)}

    def events(self) -> list[dict]:
        return self.server.read_all(self.kind("Event"))

    async def until(self, predicate, timeout: float = 20.0, what: str = "condition", every: float = 0.1):
        """Poll until predicate() is truthy; its value is returned. A predicate that looks
        something up (`next(...)` over events kopf posts in the background) may not find it yet.
        A costly predicate (hundreds of objects, in the operator's event loop) polls less often."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                value = predicate()
            except (KeyError, TypeError, IndexError, StopIteration):
                value = None
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(every)

    def status(self, kind: str, name: str) -> dict:
        return (self.get(kind, name) or {}).get("status") or {}

    # --- playing the controllers and kubelets -----------------------------------------
    async def run_pods(self, owner: dict, count: int, *, ready: bool = True, suffix: str = "", **status) -> list[str]:
        """Create `count` pods from a workload's template, as its controller would, and report
        them Running (and Ready) unless `status` says otherwise."""
        template = owner["spec"]["template"]
        names = []
        for i in range(count):
            name = f"{owner['metadata']['name']}-{i}{suffix}"
            labels = dict(template["metadata"]["labels"])
            if owner["kind"] == "Job":  # the Job controller labels each pod with its Job and index
                labels["batch.kubernetes.io/job-name"] = owner["metadata"]["name"]
                labels["batch.kubernetes.io/job-completion-index"] = str(i)
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": dict(template["metadata"].get("annotations", {})),
                },
                "spec": copy.deepcopy(template["spec"]),
                "status": status or pod_running(ready),
            }
            await self.create(pod)
            names.append(name)
        return names


def pod_running(ready: bool = True) -> dict:
    return {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "main", "restartCount": 0, "ready": ready, "state": {"running": {}}}],
    }


def pod_waiting(reason: str, message: str, restarts: int = 0) -> dict:
    return {
        "phase": "Pending" if "Image" in reason else "Running",
        "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [
            {"name": "main", "restartCount": restarts, "ready": False,
             "state": {"waiting": {"reason": reason, "message": message}}}
        ],
    }


def pod_creating() -> dict:
    """Scheduled, its containers not started yet (volumes attaching, mounting)."""
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "main", "restartCount": 0, "ready": False,
                               "state": {"waiting": {"reason": "ContainerCreating"}}}],
    }


def pod_unschedulable(message: str) -> dict:
    return {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
    }


def pod_failed(exit_code: int = 1, reason: str = "Error") -> dict:
    return {
        "phase": "Failed",
        "containerStatuses": [
            {"name": "main", "restartCount": 0, "ready": False,
             "state": {"terminated": {"exitCode": exit_code, "reason": reason}}}
        ],
    }


def pod_succeeded(finished_step: int) -> dict:
    """Exited 0, its rank 0's `rlkube.config.cli.write_finished_step` as termination message."""
    from rlkube.config.cli import FINISHED_STEP

    return {
        "phase": "Succeeded",
        "containerStatuses": [
            {"name": "main", "restartCount": 0, "ready": False, "state": {"terminated": {
                "exitCode": 0, "reason": "Completed", "message": json.dumps({FINISHED_STEP: finished_step})}}}
        ],
    }


def pod_disrupted(reason: str = "PreemptionByScheduler", message: str = "Preempted in order to admit critical pod") -> dict:
    """Killed by a disruption: the condition Kubernetes adds before preempting or evicting it."""
    return pod_failed(exit_code=137) | {
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}]}
