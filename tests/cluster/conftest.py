"""The local cluster's API server and controllers as a separate process
(`python -m e2e.localcluster up --no-kubelet`), driven over HTTP and with `kubectl`. Tests play
the kubelet themselves by writing pod status."""

import uuid
from pathlib import Path

import pytest
import requests

from e2e.scenarios.harness import LocalCluster, kubectl, kubectl_missing, require
from tests.fixtures.polling import wait_until


class LocalApi:
    def __init__(self, url: str, kubeconfig: Path):
        self.url = url
        self.kubeconfig = kubeconfig
        self.http = requests.Session()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Its output; unchecked, stdout and stderr (a refusal's message) together."""
        require(kubectl_missing())
        done = kubectl(self.kubeconfig, *args, input=input, check=check)
        return done.stdout if check else done.stdout + done.stderr

    def request(self, method: str, path: str, body=None, ok=(200, 201), **kwargs) -> requests.Response:
        headers = {"Content-Type": kwargs.pop("content_type", "application/merge-patch+json")}
        response = self.http.request(method, self.url + path, json=body, headers=headers, timeout=30, **kwargs)
        assert response.status_code in ok, f"{method} {path}: {response.status_code} {response.text}"
        return response

    def get(self, path: str) -> dict | None:
        response = self.request("GET", path, ok=(200, 404))
        return response.json() if response.status_code == 200 else None

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, obj).json()

    def patch(self, path: str, patch, content_type: str = "application/merge-patch+json") -> dict:
        return self.request("PATCH", path, patch, content_type=content_type).json()

    def delete(self, path: str, ok=(200,), **options) -> requests.Response:
        return self.request("DELETE", path, options or None, ok=ok)

    def items(self, path: str, **params) -> list[dict]:
        return self.request("GET", path, params=params).json()["items"]

    def until(self, predicate, what: str, timeout: float = 30.0):
        """Poll until predicate() is truthy and return its value."""
        return wait_until(predicate, timeout, what)

    def set_pod_status(self, ns: str, name: str, phase: str, ready: bool = False, exit_code: int | None = None,
                       conditions: tuple[dict, ...] = ()) -> dict:
        """Play the kubelet: report the pod's phase, readiness and exit code."""
        state = {"running": {}} if exit_code is None else {"terminated": {"exitCode": exit_code}}
        status = {"phase": phase,
                  "conditions": [{"type": "Ready", "status": str(ready)}, *conditions],
                  "containerStatuses": [{"name": "main", "ready": ready, "restartCount": 0, "state": state}]}
        return self.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": status})


@pytest.fixture(scope="module")
def local_api(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("localapi"), "default", kubelet=False).start()
    try:
        yield LocalApi(cluster.info["api_url"], cluster.kubeconfig)
    finally:
        cluster.stop()


@pytest.fixture
def ns(local_api) -> str:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    local_api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name
