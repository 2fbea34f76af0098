"""NetworkPolicy ingress on the local cluster (netpolicy.py): connections are tried from inside
client pods' network namespaces to fenced server pods, as a tenant's pod would, across the
namespaces of one cluster; under policies written here and under the operator's own for a run."""

import subprocess
import sys
import uuid

import pytest

from e2e.localcluster.network import unavailable_reason
from e2e.scenarios.harness import LocalCluster
from tests.cluster.conftest import LocalApi
from tests.fixtures.prerequisites import require

# Listens on each port given (the kernel completes a connection without an accept()).
LISTEN = "import socket, sys, time; s = [socket.create_server(('', int(p))) for p in sys.argv[1:]]; time.sleep(3600)"
WEB_PORTS = {"web": 8080, "other": 8081}  # two, so that one a policy does not list can be tried
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3]))"
DATA_PORT = 41000  # one of the ports gloo, NCCL's bootstrap and UCX listen on (any free port)
REFUSED_WITHIN_S = 1.5  # a dropped SYN: the client waits this long, then counts it refused


def pod(name: str, labels: dict, ports: dict[str, int] | None = None) -> dict:
    """A pod listening on `ports` (by name), ready once it does; without, a client that sleeps."""
    ports = ports or {}
    container = {"name": "main", "image": "ignored",
                 "command": ["python", "-c", LISTEN, *map(str, ports.values())] if ports else ["sleep", "600"]}
    if ports:
        container["readinessProbe"] = {"tcpSocket": {"port": min(ports.values())}, "periodSeconds": 1}
        container["ports"] = [{"name": name, "containerPort": port} for name, port in ports.items()]
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
        done = subprocess.run(["nsenter", "-t", pid, "-n", sys.executable, "-I", "-S", "-c", CONNECT,
                               server["status"]["podIP"], str(port), str(timeout)],
                              check=False, capture_output=True, text=True, timeout=timeout + 120)
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
    for ns, name, labels, ports in [(home, "web", {"app": "web"}, WEB_PORTS), (home, "open", {"app": "open"}, WEB_PORTS),
                                    (home, "friend", {"role": "client"}, None),
                                    (stranger, "outsider", {"role": "client"}, None),
                                    (monitoring, "scraper", {"role": "client"}, None),
                                    (monitoring, "unlabelled", {}, None)]:
        net.create(ns, pod(name, labels, ports))
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
    net.create(home, pod("web", {"app": "web"}, WEB_PORTS))
    net.create(stranger, pod("outsider", {"role": "client"}))
    web, outsider = net.running(home, "web"), net.running(stranger, "outsider")
    assert not net.connects(outsider, web, 8080)

    net.api.patch(f"/api/v1/namespaces/{stranger}", {"metadata": {"labels": {"purpose": "monitoring"}}})
    net.until_connects(outsider, web, 8080, True, "the relabelled namespace admitted")
    assert not net.connects(outsider, web, 8081), "still only on the port the rule lists"

    net.api.delete(f"/apis/networking.k8s.io/v1/namespaces/{home}/networkpolicies/web")
    net.until_connects(outsider, web, 8081, True, "every port open once the policy is deleted")


def test_a_runs_networkpolicies_fence_its_ports(net):
    """The operator's NetworkPolicies for an RLRun, rendered by its builders (as
    tests/operator/test_manifests.py renders them), on pods with the run's real pod labels
    listening on its ports: the stores and the servers' data ports (vLLM's own sockets, NCCL's,
    NIXL's) admit only the run's pods that need them, another
    namespace's pods (with the run's labels or the scraper's) reach nothing, the scraper's
    namespace reaches only /metrics ports and the operator only the status port."""
    from rlkube_operator.spec import RLRunSpec

    from tests.operator.test_manifests import GPU_RLRUN, RUN, manifests

    spec = RLRunSpec.model_validate(GPU_RLRUN)
    objs = manifests("RLRun", spec)
    labels = {o["metadata"]["name"].removeprefix(f"{RUN.name}-"): o["spec"]["template"]["metadata"]["labels"]
              for o in objs if o["kind"] in ("StatefulSet", "Deployment", "Job")}
    nccl, grpc = spec.config.weights.nccl_port, spec.config.rollouts.port
    vllm, status = spec.config.inference.port, spec.config.orchestrator.http_port
    for ns in (RUN.namespace, "tenant-b", "monitoring", "rlkube"):
        net.api.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    for policy in (o for o in objs if o["kind"] == "NetworkPolicy"):
        policy["metadata"].pop("ownerReferences")  # no RLRun here: the garbage collector would take it
        net.create(RUN.namespace, policy)
    for ns, name, pod_labels, ports in [
        (RUN.namespace, "trainer-0", labels["trainer-0"], {"torchrun": 29500, "nccl": nccl, "data": DATA_PORT}),
        (RUN.namespace, "trainer-1", labels["trainer-0"], None),
        (RUN.namespace, "inference-0", labels["inference"], {"http": vllm, "data": DATA_PORT}),
        (RUN.namespace, "orchestrator", labels["orchestrator"], {"grpc": grpc, "http": status}),
        ("tenant-b", "lookalike", labels["trainer-0"], None),
        ("tenant-b", "fake-scraper", {"rlkube.dev/metrics-scraper": "true"}, None),
        ("monitoring", "prometheus", {}, None),
        ("rlkube", "operator", {"app.kubernetes.io/name": "rlkube-operator"}, None),
    ]:
        net.create(ns, pod(name, pod_labels, ports))
    trainer, trainer_1 = net.running(RUN.namespace, "trainer-0"), net.running(RUN.namespace, "trainer-1")
    inference, orchestrator = net.running(RUN.namespace, "inference-0"), net.running(RUN.namespace, "orchestrator")
    lookalike, fake_scraper = net.running("tenant-b", "lookalike"), net.running("tenant-b", "fake-scraper")
    prometheus, operator = net.running("monitoring", "prometheus"), net.running("rlkube", "operator")

    for client, server, port in [(trainer_1, trainer, 29500), (inference, trainer, nccl),
                                 (trainer_1, trainer, DATA_PORT), (inference, trainer, DATA_PORT),
                                 (orchestrator, inference, vllm), (trainer, orchestrator, grpc),
                                 (trainer, inference, DATA_PORT),
                                 (prometheus, inference, vllm), (operator, orchestrator, status)]:
        assert net.connects(client, server, port, timeout=10), (client["metadata"]["name"], server["metadata"]["name"], port)
    for client, server, port in [(inference, trainer, 29500), (orchestrator, trainer, 29500), (orchestrator, trainer, nccl),
                                 (orchestrator, trainer, DATA_PORT), (orchestrator, inference, DATA_PORT),
                                 (lookalike, trainer, 29500), (lookalike, inference, vllm), (fake_scraper, inference, vllm),
                                 (prometheus, trainer, 29500), (operator, orchestrator, grpc)]:
        assert not net.connects(client, server, port), (client["metadata"]["name"], server["metadata"]["name"], port)
