"""Reads of a cluster's objects through one kept-alive API client.

The scenarios poll: a run's status every couple of seconds, its pods, the operator's Lease. A
`kubectl get` per read is a process (~0.1-0.2 s of a core) competing with the run under test on
a 2-core machine, several times a poll; this reads the same objects with the official client,
over one connection, resolving kind names as kubectl does (plural, singular, short name, kind)
through the API's discovery documents. Writes stay with kubectl, as a user makes them."""

from dataclasses import dataclass
from pathlib import Path

from kubernetes import config
from kubernetes.client.exceptions import ApiException


@dataclass(frozen=True)
class Resource:
    prefix: str  # "/api/v1" or "/apis/<group>/<version>"
    plural: str
    namespaced: bool

    def path(self, namespace: str, name: str = "") -> str:
        scope = f"/namespaces/{namespace}" if self.namespaced else ""
        return f"{self.prefix}{scope}/{self.plural}" + (f"/{name}" if name else "")


class Reads:
    def __init__(self, kubeconfig: Path | None, namespace: str):
        self.client = config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None)
        self.namespace = namespace
        self._resources: dict[str, Resource] | None = None

    def get(self, kind: str, name: str) -> dict | None:
        """The object, or None if there is none of that name."""
        try:
            return self._get(self._resource(kind).path(self.namespace, name))
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def objects(self, kind: str, selector: str | None = None) -> list[dict]:
        query = [("labelSelector", selector)] if selector else []
        return self._get(self._resource(kind).path(self.namespace), query)["items"]

    def _get(self, path: str, query: list | None = None) -> dict:
        return self.client.call_api(path, "GET", query_params=query or [], response_types_map={200: "object"},
                                    auth_settings=["BearerToken"], _return_http_data_only=True)

    def _resource(self, kind: str) -> Resource:
        if self._resources is None or kind.lower() not in self._resources:
            self._resources = self._discover()
        try:
            return self._resources[kind.lower()]
        except KeyError:
            raise ValueError(f"the API serves no resource named {kind!r}") from None

    def _discover(self) -> dict[str, Resource]:
        """Every name kubectl accepts for a resource, from the discovery documents."""
        prefixes = ["/api/v1"] + [f"/apis/{group['preferredVersion']['groupVersion']}"
                                  for group in self._get("/apis").get("groups", [])]
        names = {}
        for prefix in prefixes:
            for entry in self._get(prefix).get("resources", []):
                if "/" in entry["name"]:  # a subresource (pods/log, rlruns/status)
                    continue
                resource = Resource(prefix, entry["name"], entry["namespaced"])
                for alias in (entry["name"], entry.get("singularName"), entry["kind"], *entry.get("shortNames", [])):
                    if alias:
                        names.setdefault(alias.lower(), resource)
        return names
