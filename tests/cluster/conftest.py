"""The local cluster's API server and controllers as a separate process
(`python -m e2e.localcluster up --no-kubelet`), driven over HTTP and with `kubectl`. Tests play
the kubelet themselves by writing pod status."""

import asyncio
import uuid
from pathlib import Path

import pytest

from e2e.localcluster.client import Api
from e2e.scenarios.harness import LocalCluster, kubectl, kubectl_missing
from tests.fixtures.polling import wait_until
from tests.fixtures.prerequisites import require

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here starts the local cluster (its API server and controllers as a process,
    or its kubelet's pods): the `slow` tier, which `make test-fast` leaves out."""
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.slow)


class LocalApi:
    """Calls by path, each run to its end with the local cluster's own client (the tests here
    are synchronous: the cluster is another process), and kubectl against the same cluster."""

    def __init__(self, url: str, kubeconfig: Path):
        self.url = url
        self.kubeconfig = kubeconfig
        self.api = Api(url)
        self.runner = asyncio.Runner(loop_factory=asyncio.new_event_loop)

    def close(self) -> None:
        self.runner.run(self.api.close())
        self.runner.close()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Its output; unchecked, stdout and stderr (a refusal's message) together."""
        require(kubectl_missing())
        done = kubectl(self.kubeconfig, *args, input=input, check=check)
        return done.stdout if check else done.stdout + done.stderr

    def _send(self, method: str, path: str, body=None, content_type: str = "application/merge-patch+json",
             params: dict | None = None) -> tuple[int, dict]:
        """The answer's status and body."""
        return self.runner.run(self.api.request(method, path, body, content_type, params))

    def request(self, method: str, path: str, body=None, ok=(200, 201), **options) -> dict:
        """The answer's body, its status one of `ok`."""
        status, answer = self._send(method, path, body, **options)
        assert status in ok, f"{method} {path}: {status} {answer}"
        return answer

    def get(self, path: str) -> dict | None:
        status, answer = self._send("GET", path)
        assert status in (200, 404), f"GET {path}: {status} {answer}"
        return answer if status == 200 else None

    def create(self, path: str, obj: dict) -> dict:
        return self.request("POST", path, obj)

    def patch(self, path: str, patch, content_type: str = "application/merge-patch+json") -> dict:
        return self.request("PATCH", path, patch, content_type=content_type)

    def delete(self, path: str, ok=(200,), **options) -> dict:
        return self.request("DELETE", path, options or None, ok=ok)

    def items(self, path: str, **params) -> list[dict]:
        return self.request("GET", path, params=params)["items"]

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
    api = LocalApi(cluster.info["api_url"], cluster.kubeconfig)
    try:
        yield api
    finally:
        api.close()
        cluster.stop()


@pytest.fixture
def ns(local_api) -> str:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    local_api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name
