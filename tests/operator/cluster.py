"""A kmock Kubernetes emulator that behaves a little more like an API server, plus helpers that
play the parts of the controllers kmock lacks (StatefulSet/Deployment/Job creating pods, the
kubelet reporting their status)."""

import asyncio
import contextvars
import copy
import datetime
import itertools
import uuid

import jsonpatch
import kmock
from kmock._internal import enums

NS = "team-a"
RESOURCES = {
    "rlkube.dev/v1alpha1/rlruns": ("RLRun", {"status"}),
    "rlkube.dev/v1alpha1/sftruns": ("SFTRun", {"status"}),
    "v1/configmaps": ("ConfigMap", set()),
    "v1/secrets": ("Secret", set()),
    "v1/services": ("Service", set()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", set()),
    "v1/pods": ("Pod", {"status"}),
    "v1/events": ("Event", set()),
    "v1/namespaces": ("Namespace", set()),
    "apps/v1/statefulsets": ("StatefulSet", {"status"}),
    "apps/v1/deployments": ("Deployment", {"status"}),
    "batch/v1/jobs": ("Job", {"status"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", set()),
    "coordination.k8s.io/v1/leases": ("Lease", set()),
    "kueue.x-k8s.io/v1beta1/workloads": ("Workload", {"status"}),
    "kueue.x-k8s.io/v1beta1/resourceflavors": ("ResourceFlavor", set()),
    "scheduling.volcano.sh/v1beta1/podgroups": ("PodGroup", {"status"}),
    "scheduling.x-k8s.io/v1alpha1/podgroups": ("PodGroup", {"status"}),
}
CLUSTER_SCOPED = ("Namespace", "ResourceFlavor")
PLURAL = {"RLRun": "rlkube.dev/v1alpha1/rlruns", "SFTRun": "rlkube.dev/v1alpha1/sftruns"}
PATHS = {
    "ConfigMap": "v1/configmaps", "Secret": "v1/secrets", "Service": "v1/services", "PersistentVolumeClaim": "v1/persistentvolumeclaims",
    "Pod": "v1/pods", "StatefulSet": "apps/v1/statefulsets", "Deployment": "apps/v1/deployments",
    "Job": "batch/v1/jobs", "Event": "v1/events", "PodDisruptionBudget": "policy/v1/poddisruptionbudgets",
    "NetworkPolicy": "networking.k8s.io/v1/networkpolicies", "Workload": "kueue.x-k8s.io/v1beta1/workloads",
    "volcano PodGroup": "scheduling.volcano.sh/v1beta1/podgroups",
    "coscheduling PodGroup": "scheduling.x-k8s.io/v1alpha1/podgroups",
    "Lease": "coordination.k8s.io/v1/leases",
    **PLURAL,
}
_counter = itertools.count()
_SERVING: contextvars.ContextVar = contextvars.ContextVar("the request being served", default=None)


class ApiServer(kmock.KubernetesEmulator):
    """Fills what the real API server fills: names from generateName, uid, creationTimestamp,
    generation (bumped on spec changes). Everything else is kmock's merge-patch store.

    Each request costs the same however many came before it. kmock picks a request's reaction
    by asking each reaction's filters whether the request is among those they see, which walks
    every request served so far: 0.4 s a request after 1,150 of them (2-core VM), so the 200-run
    failover benchmark saturated the emulator while it was still creating runs. While a request
    is served (in its own task) the server's requests are that request alone, so the filters
    decide on it alone, as they would in the whole log; tests reading the log see all of it.
    Reactions that depend on the order of requests (kmock's slices, `server[...][:1]`) would
    see only it: none are used here."""

    def __iter__(self):
        serving = _SERVING.get()
        if serving is None:
            yield from super().__iter__()
        else:
            yield serving

    async def _handle(self, request):
        serving = _SERVING.set(request)
        try:
            return await self._serve(request)
        finally:
            _SERVING.reset(serving)

    async def _serve(self, request):
        if request.resource is not None and request.action == enums.action.CREATE:
            meta = request.data.setdefault("metadata", {})
            if "name" not in meta and "generateName" in meta:
                meta["name"] = f"{meta['generateName']}{next(_counter)}"
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta.setdefault("generation", 1)
            meta["resourceVersion"] = str(next(_counter))
        elif request.resource is not None and request.action == enums.action.UPDATE and request.name:
            key = (request.resource, request.namespace, request.name)
            if key in self.objects and not self.objects[key].deleted:
                version = str(next(_counter))
                if isinstance(request.data, list):  # JSON patch (kopf's finalizers)
                    request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
                else:
                    meta = request.data.setdefault("metadata", {})
                    meta["resourceVersion"] = version
                    if "spec" in request.data:
                        meta["generation"] = self.objects[key].get("metadata", {}).get("generation", 1) + 1
        return await super()._handle(request)

    async def _render_error(self, exc):
        # The API server answers a failed JSON-patch `test` (a stale resourceVersion) with 422.
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Invalid", message=str(exc))
        return await super()._render_error(exc)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def declare_resources(server: ApiServer) -> None:
    for path, (kind, subresources) in RESOURCES.items():
        server.resources[path] = kmock.ResourceInfo(
            kind=kind, namespaced=kind not in CLUSTER_SCOPED, subresources=subresources,
            verbs={"get", "list", "watch", "create", "patch", "update", "delete"},
        )


class Cluster:
    """What a test does to the cluster, through the emulator's HTTP API (so watches fire)."""

    def __init__(self, server: ApiServer):
        self.server = server

    @staticmethod
    def url(kind: str, name: str | None = None, namespace: str = NS) -> str:
        group_version, plural = PATHS[kind].rsplit("/", 1)
        prefix = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        return f"{prefix}/namespaces/{namespace}/{plural}" + (f"/{name}" if name else "")

    async def create(self, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        obj["metadata"].setdefault("namespace", NS)
        async with self.server.post(self.url(obj["kind"]), json=obj) as response:
            assert response.status < 300, await response.text()
            return await response.json()

    async def patch(self, kind: str, name: str, patch: dict) -> dict:
        async with self.server.patch(self.url(kind, name), json=patch) as response:
            assert response.status < 300, await response.text()
            return await response.json()

    async def delete(self, kind: str, name: str) -> None:
        async with self.server.delete(self.url(kind, name)) as response:
            assert response.status < 300, await response.text()

    def get(self, kind: str, name: str) -> dict | None:
        key = (PATHS[kind], NS, name)
        try:
            obj = self.server.objects[key]
        except KeyError:
            return None
        return None if obj.deleted else copy.deepcopy(obj.raw)

    def names(self, kind: str) -> set[str]:
        return {
            name for (res, ns, name), obj in self.server.objects.items()
            if res == kmock.resource(PATHS[kind]) and ns == NS and not obj.deleted
        }

    def events(self) -> list[dict]:
        return [
            obj.raw for (res, ns, _), obj in self.server.objects.items()
            if res == kmock.resource("v1/events") and not obj.deleted
        ]

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


def pod_disrupted(reason: str = "PreemptionByScheduler", message: str = "Preempted in order to admit critical pod") -> dict:
    """Killed by a disruption: the condition Kubernetes adds before preempting or evicting it."""
    return pod_failed(exit_code=137) | {
        "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message}]}
