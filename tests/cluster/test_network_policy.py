"""NetworkPolicy ingress on the local cluster (netpolicy.py): connections are tried from inside
client pods' network namespaces to a fenced server pod, as a tenant's pod would, in three
namespaces of one cluster."""

import subprocess
import sys
import uuid

import pytest

from e2e.localcluster.network import unavailable_reason
from e2e.scenarios.harness import LocalCluster
from tests.cluster.conftest import LocalApi
from tests.fixtures.prerequisites import require

# Two ports, so that one the policy does not list can be tried.
SERVE = "python -m http.server 8080 --bind 0.0.0.0 & exec python -m http.server 8081 --bind 0.0.0.0"
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"
REFUSED_WITHIN_S = 1.5  # a dropped SYN: the client waits this long, then counts it refused


def pod(name: str, labels: dict, serve: bool) -> dict:
    container = {"name": "main", "image": "ignored", "command": ["sh", "-c", SERVE if serve else "exec sleep 600"]}
    if serve:
        container["readinessProbe"] = {"tcpSocket": {"port": 8081}, "periodSeconds": 1}
        container["ports"] = [{"name": "web", "containerPort": 8080}, {"name": "other", "containerPort": 8081}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [container]}}


class Net:
    """The cluster's API and connections tried from its pods."""

    def __init__(self, api: LocalApi):
        self.api = api

    def create(self, ns: str, obj: dict) -> dict:
        plural = {"Pod": "pods", "NetworkPolicy": "networkpolicies"}[obj["kind"]]
        prefix = "/api/v1" if obj["kind"] == "Pod" else "/apis/networking.k8s.io/v1"
        return self.api.create(f"{prefix}/namespaces/{ns}/{plural}", obj)

    def running(self, ns: str, name: str) -> dict:
        def ready():
            found = self.api.get(f"/api/v1/namespaces/{ns}/pods/{name}") or {}
            return found if any(c["type"] == "Ready" and c["status"] == "True"
                                for c in found.get("status", {}).get("conditions", [])) else None

        return self.api.until(ready, f"pod {ns}/{name} ready", timeout=60)

    def connects(self, client: dict, server: dict, port: int, timeout: float = REFUSED_WITHIN_S) -> bool:
        """Whether a TCP connection from `client`'s network namespace to `server`'s IP is
        accepted within `timeout` (the container's process is in the pod's namespace)."""
        pid = client["status"]["containerStatuses"][0]["containerID"].removeprefix("localcluster://")
        done = subprocess.run(["nsenter", "-t", pid, "-n", sys.executable, "-c", CONNECT,
                               server["status"]["podIP"], str(port), str(timeout)],
                              check=False, capture_output=True, text=True, timeout=timeout + 30)
        return done.returncode == 0

    def until_connects(self, client: dict, server: dict, port: int, expected: bool, what: str) -> None:
        """Rules follow changes on the kubelet's next sync (0.3 s): poll until they hold."""
        self.api.until(lambda: self.connects(client, server, port) == expected, what, timeout=20)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    require(unavailable_reason())
    cluster = LocalCluster(tmp_path_factory.mktemp("netpol"), "default").start()
    api = LocalApi(cluster.info["api_url"], cluster.kubeconfig)
    try:
        yield Net(api)
    finally:
        api.close()
        cluster.stop()


@pytest.fixture
def spaces(net):
    """Three fresh namespaces: the server's (`home`), a stranger's and the monitoring one."""
    tag = uuid.uuid4().hex[:6]
    names = {}
    for role in ("home", "stranger", "monitoring"):
        names[role] = f"{role}-{tag}"
        net.api.create("/api/v1/namespaces", {"metadata": {"name": names[role], "labels": {"purpose": role}}})
    return names


def fence(name: str, ingress: list[dict]) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "ingress": ingress}}


# The clients of the home namespace, and those with the same label in the monitoring namespace,
# on port 8080 (by number, and by its name in the monitoring rule).
WEB_FENCE = fence("web", [
    {"from": [{"podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": 8080, "protocol": "TCP"}]},
    {"from": [{"namespaceSelector": {"matchLabels": {"purpose": "monitoring"}},
               "podSelector": {"matchLabels": {"role": "client"}}}], "ports": [{"port": "web"}]},
])


def test_a_fenced_pod_admits_only_what_its_policy_names(net, spaces):
    home, stranger, monitoring = spaces["home"], spaces["stranger"], spaces["monitoring"]
    net.create(home, WEB_FENCE)
    for ns, name, labels, serve in [(home, "web", {"app": "web"}, True), (home, "open", {"app": "open"}, True),
                                    (home, "friend", {"role": "client"}, False),
                                    (stranger, "outsider", {"role": "client"}, False),
                                    (monitoring, "scraper", {"role": "client"}, False),
                                    (monitoring, "unlabelled", {}, False)]:
        net.create(ns, pod(name, labels, serve))
    web, open_ = net.running(home, "web"), net.running(home, "open")
    friend, outsider = net.running(home, "friend"), net.running(stranger, "outsider")
    scraper, unlabelled = net.running(monitoring, "scraper"), net.running(monitoring, "unlabelled")

    assert net.connects(friend, web, 8080, timeout=10), "a client of the server's own namespace"
    assert net.connects(scraper, web, 8080, timeout=10), "a client of the monitoring namespace (namespace + pod)"
    assert not net.connects(outsider, web, 8080), "another namespace's pod, though its labels match"
    assert not net.connects(unlabelled, web, 8080), "the monitoring namespace's pod without the label"
    assert not net.connects(friend, web, 8081), "a port no rule lists"
    assert net.connects(outsider, open_, 8081, timeout=10), "a pod no policy selects is open"


def test_rules_follow_policies_and_namespace_labels(net, spaces):
    home, stranger = spaces["home"], spaces["stranger"]
    net.create(home, WEB_FENCE)
    net.create(home, pod("web", {"app": "web"}, True))
    net.create(stranger, pod("outsider", {"role": "client"}, False))
    web, outsider = net.running(home, "web"), net.running(stranger, "outsider")
    assert not net.connects(outsider, web, 8080)

    net.api.patch(f"/api/v1/namespaces/{stranger}", {"metadata": {"labels": {"purpose": "monitoring"}}})
    net.until_connects(outsider, web, 8080, True, "the relabelled namespace admitted")
    assert not net.connects(outsider, web, 8081), "still only on the port the rule lists"

    net.api.delete(f"/apis/networking.k8s.io/v1/namespaces/{home}/networkpolicies/web")
    net.until_connects(outsider, web, 8081, True, "every port open once the policy is deleted")
