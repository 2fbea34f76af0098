"""What the local API server serves and how it describes it: the kinds (built-in ones and the
CRDs of `crds/*.yaml`), their discovery documents, the OpenAPI v3 documents kubectl reads
before `apply`, and the Table rendering `kubectl get` asks for.

Built-in kinds have no schema here (objects are stored as sent): their OpenAPI documents only
say that the kind exists and that PATCH accepts `fieldValidation`, which is what makes kubectl
leave validation to the server instead of downloading the protobuf OpenAPI v2 document. The
CRDs' documents carry their real `openAPIV3Schema`.
"""

import datetime
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"


@dataclass
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True
    subresources: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    columns: list[dict] = field(default_factory=list)  # CRD additionalPrinterColumns
    schema: dict | None = None  # the CRD's openAPIV3Schema
    scale: dict | None = None  # the CRD's `subresources.scale` paths (scale.py)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_version_path(self) -> str:
        return f"apis/{self.group}/{self.version}" if self.group else f"api/{self.version}"

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def url(self, namespace: str | None = None, name: str | None = None) -> str:
        scope = f"/namespaces/{namespace}" if namespace and self.namespaced else ""
        return f"/{self.group_version_path}{scope}/{self.plural}" + (f"/{name}" if name else "")


BUILTIN = [
    Kind("", "v1", "namespaces", "Namespace", namespaced=False, short_names=("ns",)),
    Kind("", "v1", "pods", "Pod", subresources=("status",), short_names=("po",), categories=("all",)),
    Kind("", "v1", "services", "Service", subresources=("status",), short_names=("svc",), categories=("all",)),
    Kind("", "v1", "configmaps", "ConfigMap", short_names=("cm",)),
    Kind("", "v1", "secrets", "Secret"),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", subresources=("status",),
         short_names=("pvc",)),
    Kind("", "v1", "events", "Event", short_names=("ev",)),
    Kind("apps", "v1", "statefulsets", "StatefulSet", subresources=("status",), short_names=("sts",),
         categories=("all",)),
    Kind("apps", "v1", "deployments", "Deployment", subresources=("status",), short_names=("deploy",),
         categories=("all",)),
    Kind("apps", "v1", "replicasets", "ReplicaSet", subresources=("status",), short_names=("rs",),
         categories=("all",)),
    Kind("batch", "v1", "jobs", "Job", subresources=("status",), categories=("all",)),
    # Stored only (no eviction API, no network plugin): the operator makes them for each run.
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", subresources=("status",),
         short_names=("pdb",)),
    Kind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", short_names=("netpol",)),
    # Enforced on writes (policies.py): the operator chart's guardrails.
    Kind("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
         namespaced=False),
    Kind("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings",
         "ValidatingAdmissionPolicyBinding", namespaced=False),
    # Stored only (no authentication, so no RBAC): what the operator's Helm chart installs.
    Kind("", "v1", "serviceaccounts", "ServiceAccount", short_names=("sa",)),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    # The operator replicas' leader election.
    Kind("coordination.k8s.io", "v1", "leases", "Lease"),
]


@functools.cache
def crd_kinds(crd_dir: Path = CRD_DIR) -> tuple[Kind, ...]:
    """One Kind per served version of every CRD in `crd_dir`; read once (every API server a
    test starts serves them: parsing the RLRun CRD alone takes 0.3 s)."""
    kinds = []
    for path in sorted(crd_dir.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec, names = crd["spec"], crd["spec"]["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            kinds.append(Kind(
                spec["group"], version["name"], names["plural"], names["kind"],
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                subresources=tuple(version.get("subresources") or {}),
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                columns=version.get("additionalPrinterColumns") or [],
                schema=version.get("schema", {}).get("openAPIV3Schema"),
                scale=(version.get("subresources") or {}).get("scale"),
            ))
    return tuple(kinds)


# --- discovery -----------------------------------------------------------------------------------

def resource_list(kinds: list[Kind], group: str, version: str) -> dict:
    resources = []
    for k in kinds:
        if (k.group, k.version) != (group, version):
            continue
        base = {"kind": k.kind, "namespaced": k.namespaced, "singularName": k.singular}
        resources.append(base | {
            "name": k.plural, "shortNames": list(k.short_names), "categories": list(k.categories),
            "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
        })
        resources += [base | {"name": f"{k.plural}/{sub}", "singularName": "", "verbs": ["get", "patch", "update"]}
                      | ({"group": "autoscaling", "version": "v1", "kind": "Scale"} if sub == "scale" else {})
                      for sub in k.subresources]
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}".lstrip("/"),
            "resources": resources}


def api_group(kinds: list[Kind], group: str) -> dict | None:
    versions = sorted({k.version for k in kinds if k.group == group})
    if not versions:
        return None
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
            "preferredVersion": entries[0]}


def api_group_list(kinds: list[Kind]) -> dict:
    groups = sorted({k.group for k in kinds if k.group})
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group(kinds, g) for g in groups]}


# --- OpenAPI v3 ----------------------------------------------------------------------------------

def openapi_index(kinds: list[Kind]) -> dict:
    paths = sorted({k.group_version_path for k in kinds})
    return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash=localcluster"} for p in paths}}


def _schema_name(k: Kind) -> str:
    group = ".".join(reversed(k.group.split("."))) if k.group else "io.k8s.api.core"
    return f"{group}.{k.version}.{k.kind}"


def openapi_document(kinds: list[Kind], group_version_path: str) -> dict | None:
    """The OpenAPI v3 document of one group/version, or None when it is not served."""
    served = [k for k in kinds if k.group_version_path == group_version_path]
    if not served:
        return None
    paths, schemas = {}, {}
    validation = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
    for k in served:
        gvk = {"group": k.group, "version": k.version, "kind": k.kind}
        schema = dict(k.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True})
        schema["properties"] = {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            **schema.get("properties", {}),
        }
        schema["x-kubernetes-group-version-kind"] = [gvk]
        schemas[_schema_name(k)] = schema
        ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{_schema_name(k)}"}}}}
        operation = {"x-kubernetes-group-version-kind": gvk, "parameters": [validation],
                     "responses": {"200": {"description": "OK", **ref}}}
        path = "/" + group_version_path + ("/namespaces/{namespace}" if k.namespaced else "") + f"/{k.plural}/{{name}}"
        paths[path] = {"get": operation, "put": operation, "patch": operation, "delete": operation}
        paths[path.rsplit("/", 1)[0]] = {"post": operation, "get": operation}
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes (localcluster)", "version": "v1.32.0"},
            "paths": paths, "components": {"schemas": schemas}}


# --- Table (kubectl get) -------------------------------------------------------------------------

def json_path(obj, path: str):
    """A printer column's JSONPath: `.a.b[0].c`, or a filter `[?(@.type=="Ready")]`."""
    for part in re.findall(r'\.([^.\[]+)|\[\?\(@\.(\w+)=="([^"]*)"\)\]|\[(\d+)\]', path):
        key, fkey, fval, index = part
        if isinstance(obj, dict) and key:
            obj = obj.get(key)
        elif isinstance(obj, list) and fkey:
            obj = next((i for i in obj if isinstance(i, dict) and i.get(fkey) == fval), None)
        elif isinstance(obj, list) and index and int(index) < len(obj):
            obj = obj[int(index)]
        else:
            return None
    return obj


def seconds_since(timestamp: str) -> float:
    return (datetime.datetime.now(datetime.UTC) - datetime.datetime.fromisoformat(timestamp)).total_seconds()


def age(timestamp: str | None) -> str:
    """kubectl's human-readable duration since `timestamp`."""
    if not timestamp:
        return "<unknown>"
    s = max(0, int(seconds_since(timestamp)))
    m, h, d = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if h < 3:
        return f"{m}m"
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    return f"{d}d{h % 24}h" if d < 8 and h % 24 else f"{d}d"


def _pod_status(pod: dict) -> str:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    for c in status.get("containerStatuses") or []:
        state = c.get("state") or {}
        if "waiting" in state and state["waiting"].get("reason"):
            return state["waiting"]["reason"]
        if "terminated" in state and status.get("phase") not in ("Succeeded", "Failed"):
            return state["terminated"].get("reason") or "Error"
    if status.get("phase") in ("Succeeded", "Failed"):
        terminated = [c["state"]["terminated"] for c in status.get("containerStatuses") or []
                      if "terminated" in c.get("state", {})]
        return next((t.get("reason") for t in terminated if t.get("reason")), status["phase"])
    return status.get("reason") or status.get("phase") or "Pending"


def _pod_ready(pod: dict) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return f"{sum(1 for c in statuses if c.get('ready'))}/{len(pod['spec'].get('containers', []))}"


def _job_status(job: dict) -> str:
    conditions = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    for kind in ("Complete", "Failed", "Suspended"):
        if kind in conditions:
            return kind
    return "Running"


def _ready(obj: dict, want: str = "replicas") -> str:
    status = obj.get("status") or {}
    return f"{status.get('readyReplicas', 0)}/{obj.get('spec', {}).get(want, 1)}"


Column = tuple[str, str, Callable[[dict], object], int]  # name, type, cell, priority
BUILTIN_COLUMNS: dict[str, list[Column]] = {
    "Pod": [("Ready", "string", _pod_ready, 0), ("Status", "string", _pod_status, 0),
            ("Restarts", "integer", lambda p: sum(c.get("restartCount", 0) for c in
                                                  (p.get("status") or {}).get("containerStatuses") or []), 0),
            ("IP", "string", lambda p: (p.get("status") or {}).get("podIP") or "<none>", 1),
            ("Node", "string", lambda p: p["spec"].get("nodeName") or "<none>", 1)],
    "Job": [("Status", "string", _job_status, 0),
            ("Completions", "string", lambda j: f"{(j.get('status') or {}).get('succeeded', 0)}/"
                                                f"{j['spec'].get('completions', 1)}", 0)],
    "Deployment": [("Ready", "string", _ready, 0),
                   ("Up-to-date", "integer", lambda d: (d.get("status") or {}).get("updatedReplicas", 0), 0),
                   ("Available", "integer", lambda d: (d.get("status") or {}).get("availableReplicas", 0), 0)],
    "StatefulSet": [("Ready", "string", _ready, 0)],
    "Service": [("Type", "string", lambda s: s.get("spec", {}).get("type", "ClusterIP"), 0),
                ("Cluster-IP", "string", lambda s: s.get("spec", {}).get("clusterIP", "<none>"), 0),
                ("Port(s)", "string", lambda s: ",".join(f"{p['port']}/{p.get('protocol', 'TCP')}"
                                                         for p in s.get("spec", {}).get("ports") or []) or "<none>", 0)],
    "Event": [("Type", "string", lambda e: e.get("type", ""), 0), ("Reason", "string", lambda e: e.get("reason", ""), 0),
              ("Object", "string", lambda e: f"{e.get('involvedObject', {}).get('kind', '').lower()}/"
                                             f"{e.get('involvedObject', {}).get('name', '')}", 0),
              ("Message", "string", lambda e: e.get("message", ""), 0)],
}


def _age_column(obj: dict) -> str:
    return age(obj["metadata"].get("creationTimestamp"))


def _columns(kind: Kind) -> list[Column]:
    if not kind.columns:
        return BUILTIN_COLUMNS.get(kind.kind, []) + [("Age", "string", _age_column, 0)]
    out = []
    for c in kind.columns:
        def cell(obj, c=c):
            value = json_path(obj, c["jsonPath"])
            return age(value) if c["type"] == "date" and value else value
        out.append((c["name"], "string" if c["type"] == "date" else c["type"], cell, c.get("priority", 0)))
    return out


def table(kind: Kind, objects: list[dict], include_object: str, resource_version: str) -> dict:
    """A meta.k8s.io/v1 Table; the CRD's printer columns, or kubectl-like ones for built-ins."""
    columns = _columns(kind)
    definitions = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
    definitions += [{"name": n, "type": t, "format": "", "description": n, "priority": p} for n, t, _, p in columns]
    rows = []
    for obj in objects:
        row = {"cells": [obj["metadata"]["name"], *(_cell(f, obj) for _, _, f, _ in columns)]}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": definitions, "rows": rows}


def _cell(f, obj: dict):
    try:
        value = f(obj)
    except (KeyError, TypeError, AttributeError):
        value = None
    return "<none>" if value is None else value
