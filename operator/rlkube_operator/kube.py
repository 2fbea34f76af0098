"""The few Kubernetes API calls the operator makes, through the official client, as plain dicts.

`ensure` is idempotent: create, and when the object already exists, merge-patch it to the
desired state, only where it differs (or leave it, for objects whose spec is immutable once
made, like Jobs and PVCs). `create` only creates, and never reads: for the runs' token Secrets,
whose content the operator derives (`runtoken`); one found there is read only for its keys
(`Reconciler._make_token_secret`).
It touches only objects controlled by the same owner as the desired one: anything else under
that name (a recreated run's predecessor awaiting garbage collection, someone else's object)
raises `ForeignChild`, and is neither patched nor read further.
Every verb used here is listed in the Helm chart's RBAC rules; nothing else is granted.
"""

import json
import logging
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from rlkube_operator import GROUP, VERSION
from rlkube_operator.names import RunRef, controller_uid

log = logging.getLogger(__name__)

# kind -> (API class, method suffix): the operator touches exactly these kinds.
KINDS = {
    "ConfigMap": (client.CoreV1Api, "config_map"),
    "Secret": (client.CoreV1Api, "secret"),
    "Service": (client.CoreV1Api, "service"),
    "PersistentVolumeClaim": (client.CoreV1Api, "persistent_volume_claim"),
    "Pod": (client.CoreV1Api, "pod"),
    "StatefulSet": (client.AppsV1Api, "stateful_set"),
    "Deployment": (client.AppsV1Api, "deployment"),
    "Job": (client.BatchV1Api, "job"),
    "PodDisruptionBudget": (client.PolicyV1Api, "pod_disruption_budget"),
    "NetworkPolicy": (client.NetworkingV1Api, "network_policy"),
    "Event": (client.CoreV1Api, "event"),
}
IMMUTABLE = {"Job", "PersistentVolumeClaim"}
"""Created once, never patched: a Job's and a claim's spec cannot change."""
MERGE_PATCH = "application/merge-patch+json"


class ForeignChild(Exception):
    """A child's name is taken by an object this run does not control."""

    def __init__(self, obj: dict):
        meta = obj["metadata"]
        self.kind, self.name = obj.get("kind", "object"), meta["name"]
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
        self.owner = refs[0] if refs else None
        owner = f"{self.owner['kind']} {self.owner['name']} (uid {self.owner['uid']})" if self.owner else "no owner"
        super().__init__(f"{self.kind} {self.name} belongs to {owner}")


def api_client(host: str | None = None) -> client.ApiClient:
    """In-cluster credentials, else the kubeconfig; or a bare `host` (tests, kmock)."""
    if host is not None:
        return client.ApiClient(client.Configuration(host=host))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


class Kube:
    def __init__(self, api: client.ApiClient):
        self._api = api

    @property
    def api_client(self) -> client.ApiClient:
        """For calls beyond the kinds above (Kueue's Workloads: `queueing.Kueue`)."""
        return self._api

    def _method(self, verb: str, kind: str):
        cls, suffix = KINDS[kind]
        return getattr(cls(self._api), f"{verb}_namespaced_{suffix}")

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return json_body(self._method("read", kind)(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str, labels: dict[str, str], fields: dict[str, str] | None = None) -> list[dict]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        field_selector = ",".join(f"{k}={v}" for k, v in (fields or {}).items())
        response = self._method("list", kind)(
            namespace, label_selector=selector, field_selector=field_selector, _preload_content=False
        )
        items = json_body(response).get("items", [])
        # Some servers (and emulators) ignore the selectors; filter again so callers can trust them.
        return [
            i for i in items
            if labels.items() <= (i.get("metadata", {}).get("labels") or {}).items()
            and all(_field(i, k) == v for k, v in (fields or {}).items())
        ]

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict:
        method = self._method("patch", kind)
        return json_body(method(name, namespace, patch, _content_type=MERGE_PATCH, _preload_content=False))

    def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete with background propagation (the Job's pods go too); False if already gone.
        With `uid`, only that object: not one recreated under the same name meanwhile."""
        body = {"propagationPolicy": "Background"} | ({"preconditions": {"uid": uid}} if uid else {})
        try:
            self._method("delete", kind)(name, namespace, body=body, _preload_content=False)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def delete_run(self, run: RunRef) -> bool:
        """Delete the run itself (its `ttlSecondsAfterFinished` passed), that very object only:
        not one recreated under its name. False if it is already gone."""
        body = {"propagationPolicy": "Background", "preconditions": {"uid": run.uid}}
        try:
            client.CustomObjectsApi(self._api).delete_namespaced_custom_object(
                GROUP, VERSION, run.namespace, run.plural, run.name, body=body, _preload_content=False)
            return True
        except ApiException as e:
            if e.status in (404, 409):  # gone, or another object under the name
                return False
            raise

    def delete_owned(self, kind: str, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete the object if `owner_uid` controls it; False if it is gone or someone else's."""
        obj = self.get(kind, namespace, name)
        if obj is None or controller_uid(obj) != owner_uid:
            return False
        return self.delete(kind, namespace, name, uid=obj["metadata"]["uid"])

    def create(self, obj: dict) -> bool:
        """Create `obj`; False if an object of that name is already there, which is neither read
        nor changed (a Secret's value must not be rotated under the pods that read it)."""
        meta = obj["metadata"]
        try:
            self._method("create", obj["kind"])(meta["namespace"], obj, _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        log.info("created %s %s/%s", obj["kind"], meta["namespace"], meta["name"])
        return True

    def ensure(self, obj: dict) -> dict:
        """Create `obj`, or bring the existing object to it, if it has the same controller."""
        kind, meta = obj["kind"], obj["metadata"]
        existing = self.get(kind, meta["namespace"], meta["name"])
        if existing is None:
            try:
                created = self._method("create", kind)(meta["namespace"], obj, _preload_content=False)
                log.info("created %s %s/%s", kind, meta["namespace"], meta["name"])
                return json_body(created)
            except ApiException as e:
                if e.status != 409:
                    raise
            existing = self.get(kind, meta["namespace"], meta["name"]) or {"metadata": meta}
        if controller_uid(existing) != controller_uid(obj):
            raise ForeignChild({"kind": kind} | existing)
        if kind in IMMUTABLE:
            return existing
        patch = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
        patch["metadata"] = {"labels": meta.get("labels"), "ownerReferences": meta.get("ownerReferences")}
        if contains(existing, patch):
            return existing  # already as desired: a PATCH would only cost the API server a write
        return self.patch(kind, meta["namespace"], meta["name"], patch)

    def served(self, group: str, version: str) -> set[str]:
        """The resources (plurals) the API server serves in `group/version`; empty if none."""
        try:
            response = self._api.call_api(f"/apis/{group}/{version}", "GET", auth_settings=["BearerToken"],
                                          _return_http_data_only=True, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return set()
            raise
        return {r["name"] for r in json_body(response).get("resources", [])}

    def get_rlkube(self, plural: str, namespace: str, name: str) -> dict | None:
        """An rlkube.dev object (a run's RLPool); None when there is none."""
        try:
            return json_body(client.CustomObjectsApi(self._api).get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def list_rlkube(self, plural: str, namespaces: tuple[str, ...] | None) -> "list[dict]":
        """rlkube.dev objects in `namespaces`, or in every namespace (None)."""
        api = client.CustomObjectsApi(self._api)
        if namespaces is None:
            return json_body(api.list_cluster_custom_object(GROUP, VERSION, plural, _preload_content=False))["items"]
        return [item for ns in namespaces for item in json_body(api.list_namespaced_custom_object(
            GROUP, VERSION, ns, plural, _preload_content=False))["items"]]

    def namespace_labels(self, name: str) -> dict[str, str]:
        """A namespace's labels (what a pool's `allowedRuns` selector matches); none if it is gone."""
        try:
            namespace = json_body(client.CoreV1Api(self._api).read_namespace(name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return {}
            raise
        return namespace.get("metadata", {}).get("labels") or {}

    def patch_status(self, run: RunRef, status: dict[str, Any]) -> dict:
        """Merge-patch the run's status subresource (null deletes a field)."""
        return json_body(client.CustomObjectsApi(self._api).patch_namespaced_custom_object_status(
            GROUP, VERSION, run.namespace, run.plural, run.name, {"status": status},
            _content_type=MERGE_PATCH, _preload_content=False))


def json_body(response) -> dict:
    """A response read with `_preload_content=False`, as a plain dict."""
    return json.loads(response.data or b"{}")


def contains(existing, desired) -> bool:
    """Whether `existing` already has every field `desired` sets: dicts key by key (a null in
    `desired` asks for the field's absence, as in a merge patch), lists element by element with
    the same length. Fields the API server fills in (defaults inside containers, status) are
    extra keys of `existing`, so they do not count as differences."""
    if isinstance(desired, dict):
        return isinstance(existing, dict) and all(
            existing.get(k) is None if v is None else k in existing and contains(existing[k], v)
            for k, v in desired.items())
    if isinstance(desired, list):
        return (isinstance(existing, list) and len(existing) == len(desired)
                and all(contains(e, d) for e, d in zip(existing, desired, strict=True)))
    return existing == desired


def _field(obj: dict, path: str):
    """A field selector's value (`involvedObject.kind`) read from the object."""
    value = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value
