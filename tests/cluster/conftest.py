"""The local cluster's API server and controllers as a separate process
(`python -m e2e.localcluster up --no-kubelet`), driven over HTTP and with `kubectl`. Tests play
the kubelet themselves by writing pod status."""

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import requests

from e2e.scenarios.harness import kubectl_missing, require
from tests.fixtures.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


class LocalApi:
    def __init__(self, url: str, kubeconfig: Path):
        self.url = url
        self.kubeconfig = kubeconfig
        self.http = requests.Session()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        require(kubectl_missing())
        done = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, timeout=60,
                              env=os.environ | {"KUBECONFIG": str(self.kubeconfig)}, check=False)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
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
    state = tmp_path_factory.mktemp("localapi")
    with open(state / "cluster.log", "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "e2e.localcluster", "up", "--no-kubelet", "--state-dir",
                                    str(state)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not (state / "cluster.json").exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the local API server did not start: {(state / 'cluster.log').read_text()}")
            time.sleep(0.2)
        yield LocalApi(json.loads((state / "cluster.json").read_text())["api_url"], state / "kubeconfig")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


@pytest.fixture
def ns(local_api) -> str:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    local_api.create("/api/v1/namespaces", {"metadata": {"name": name}})
    return name
