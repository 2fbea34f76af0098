"""What a scenario does to a cluster, through `kubectl` like a user: apply, get, delete, wait,
read a run's status, kill a pod's processes, read a file from a claim.

Two clusters implement it: `LocalCluster` (e2e/localcluster: an emulated API server whose pods
run as real processes on this machine) and `KubeCluster` (any real cluster, kind included, given
a kubeconfig). Scenarios only use this interface, so the same files run on both.
"""

import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import yaml

from e2e.scenarios.reads import Reads
from tests.fixtures import processes
from tests.fixtures.polling import wait_until

REPO = Path(__file__).resolve().parents[2]


class ClusterError(AssertionError):
    pass


def kubectl_missing() -> str | None:
    return None if shutil.which("kubectl") else "kubectl is not installed"


def kubectl(kubeconfig: Path | None, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess:
    """`kubectl <args>` against `kubeconfig` (None: the environment's), output captured as text;
    with `check`, a failure raises ClusterError with the end of its stderr. The one place tests
    and scenarios run kubectl."""
    env = os.environ | ({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {})
    result = subprocess.run(["kubectl", *args], input=input, capture_output=True, text=True, env=env,
                            timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"{shlex.join(result.args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


class Cluster:
    """The common part: kubectl in one namespace."""

    def __init__(self, kubeconfig: Path | None, namespace: str):
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.started = time.monotonic()

    # --- kubectl ------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60) -> str:
        return kubectl(self.kubeconfig, "-n", self.namespace, *args, input=input, check=check, timeout=timeout).stdout

    def apply(self, *docs: dict) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

    # --- reads (polled): one API client, not a kubectl process each --------------------
    @functools.cached_property
    def reads(self) -> Reads:
        return Reads(self.kubeconfig, self.namespace)

    def get(self, kind: str, name: str) -> dict | None:
        return self.reads.get(kind, name)

    def names(self, kind: str, selector: str | None = None) -> list[str]:
        return sorted(item["metadata"]["name"] for item in self.reads.objects(kind, selector))

    def delete(self, kind: str, name: str, *flags: str) -> None:
        self.kubectl("delete", kind, name, "--ignore-not-found", *flags, timeout=180)

    def status(self, kind: str, name: str) -> dict:
        return (self.get(kind, name) or {}).get("status") or {}

    def wait(self, predicate: Callable[[], object], timeout: float, what: str, interval: float = 2.0):
        """Poll until `predicate()` is truthy and return it; on time-out, fail with `what` and
        the cluster's state (so a CI log says why)."""
        return wait_until(predicate, timeout, what, interval, self.describe_state, ClusterError)

    def wait_phase(self, kind: str, name: str, phases: set[str], timeout: float) -> dict:
        def reached():
            status = self.status(kind, name)
            if status.get("phase") == "Failed" and "Failed" not in phases:
                raise ClusterError(f"{kind}/{name} failed: {status.get('message')}\n{self.describe_state()}")
            return status if status.get("phase") in phases else None

        return self.wait(reached, timeout, f"{kind}/{name} to reach {sorted(phases)}")

    def describe_state(self) -> str:
        parts = []
        for args in (("get", "rlruns,sftruns,jobs,pods", "-o", "wide"),):
            parts.append(self.kubectl(*args, check=False))
        parts.append(self.logs_tail())
        return "\n".join(parts)

    def incarnation(self, pod: str) -> tuple[str, int]:
        """(uid, restarts of its containers): either changes when a pod is killed, whether its
        container restarts in place or its controller replaces it."""
        obj = self.get("pod", pod) or {}
        statuses = (obj.get("status") or {}).get("containerStatuses") or []
        return obj.get("metadata", {}).get("uid", ""), sum(int(s.get("restartCount", 0)) for s in statuses)

    def ready(self, pod: str) -> bool:
        """Whether the pod's `Ready` condition is True (its readiness probe passes)."""
        conditions = self.status("pod", pod).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def operator_leader(self) -> str:
        """The operator pod that reconciles: the holder of the Lease its replicas elect it by."""
        def holder():
            names = [lease["spec"].get("holderIdentity") for lease in self.reads.objects("leases")
                     if lease["metadata"]["name"].endswith("rlkube-operator")]
            return names[0] if names and names[0] and self.get("pod", names[0]) else None

        return self.wait(holder, 120, "an operator replica to hold the leader Lease")

    def pod_of(self, selector: str) -> dict | None:
        """The newest live pod matching a label selector."""
        pods = [p for p in self.reads.objects("pods", selector) if not p["metadata"].get("deletionTimestamp")]
        pods.sort(key=lambda p: p["metadata"]["creationTimestamp"])
        return pods[-1] if pods else None

    # --- what differs between clusters --------------------------------------------------
    def listening_ports(self, pod: str) -> list[int]:
        """The TCP ports the pod accepts connections on from other pods. Here: those its
        containers declare (a real cluster's pods cannot be looked into without exec)."""
        spec = (self.get("pod", pod) or {}).get("spec") or {}
        return sorted({p["containerPort"] for c in spec.get("containers", []) for p in c.get("ports", [])
                       if p.get("protocol", "TCP") == "TCP"})

    def kill(self, pod: str) -> None:
        """Kill the pod's processes at once, as a crash, the OOM killer or a lost node would."""
        raise NotImplementedError

    def read_file(self, claim: str, path: str) -> str | None:
        """A file from a PersistentVolumeClaim, None if it does not exist."""
        raise NotImplementedError

    def logs_tail(self, lines: int = 30) -> str:
        return ""

    def seed_model(self, claim: str) -> str:
        """A tiny untrained model where a run's pods can load it; returns its path in the pods."""
        raise NotImplementedError

    @property
    def host_address(self) -> str:
        """An address of this machine that pods can reach (an S3 server for the object-store
        scenario listens there)."""
        raise NotImplementedError


class LocalCluster(Cluster):
    """`python -m e2e.localcluster up` as a child process; pods are processes on this machine.
    `kubelet=False`: the API server and controllers only (`--no-kubelet`: no pod runs, no root
    needed; tests play the kubelet). `images`: `venv` (the virtualenv stands in for every image)
    or `podman` (every container from its image in podman's store: `make images`)."""

    def __init__(self, state_dir: Path, namespace: str, kubelet: bool = True, images: str = "venv"):
        super().__init__(state_dir / "kubeconfig", namespace)
        self.state_dir = state_dir
        self.kubelet = kubelet
        self.images = images
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "LocalCluster":
        self.process = processes.spawn(
            [sys.executable, "-m", "e2e.localcluster", "up", "--state-dir", str(self.state_dir),
             "--namespace", self.namespace, "--images", self.images, *([] if self.kubelet else ["--no-kubelet"])],
            log=self.state_dir / "cluster.log", cwd=REPO, timeout=timeout, what="the local cluster",
            error=ClusterError,
            ready=lambda: (self.state_dir / "cluster.json").exists() and self.kubeconfig.exists() and self._answers())
        return self

    @property
    def info(self) -> dict:
        """`cluster.json`: `api_url`, `host_ip` (where pods reach the API server), `port`."""
        return json.loads((self.state_dir / "cluster.json").read_text())

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.info['api_url']}/api/v1/namespaces/{self.namespace}", timeout=5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            processes.stop(self.process)

    def _pod_netns(self, pod: str) -> str:
        """The network namespace holding the pod's IP."""
        ip = self.status("pod", pod).get("podIP")
        if not ip:
            raise ClusterError(f"pod {pod} has no IP yet")
        for netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                                    check=True).stdout.split("\n"):
            name = netns.split(" ")[0]
            if name.startswith("rlk-"):
                addrs = subprocess.run(["ip", "-n", name, "-4", "-o", "addr"], capture_output=True,
                                       text=True, check=False).stdout
                if f" {ip}/" in addrs:
                    return name
        raise ClusterError(f"no network namespace holds pod {pod}'s IP {ip}")

    def listening_ports(self, pod: str) -> list[int]:
        """Every TCP port a socket listens on in the pod's network namespace on an address other
        pods reach (not loopback): the declared ones and those gloo, NCCL or vLLM pick."""
        out = subprocess.run(["ip", "netns", "exec", self._pod_netns(pod), "ss", "-Hltn"], capture_output=True,
                             text=True, check=True).stdout
        local = [line.split()[3] for line in out.splitlines() if line.strip()]
        return sorted({int(a.rsplit(":", 1)[1]) for a in local
                       if not a.rsplit(":", 1)[0].strip("[]").startswith(("127.", "::1"))})

    def kill(self, pod: str) -> None:
        """SIGKILL every process of the pod (its container restarts in place)."""
        netns = self._pod_netns(pod)
        pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                              check=True).stdout.split()
        if not pids:
            raise ClusterError(f"pod {pod} has no processes")
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass

    def claim_dir(self, claim: str) -> Path:
        return self.state_dir / "pvcs" / self.namespace / claim

    def read_file(self, claim: str, path: str) -> str | None:
        file = self.claim_dir(claim) / path.lstrip("/")
        return file.read_text() if file.is_file() else None

    def seed_model(self, claim: str) -> str:
        """`rlkube model init` into the claim (the pods mount claims at /data)."""
        from rlkube.models.tiny import init_tiny_model

        target = self.claim_dir(claim) / "models" / "tiny"
        if not (target / "config.json").exists():
            init_tiny_model(target)
        return "/data/models/tiny"

    def logs_tail(self, lines: int = 30) -> str:
        out = []
        for log in sorted((self.state_dir / "logs").glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(tail))
        return "\n".join(out)

    @property
    def host_address(self) -> str:
        return self.info["host_ip"]


class KubeCluster(Cluster):
    """A real cluster (kind, or any) from `$KUBECONFIG`; the operator is installed beforehand
    (e2e/run.sh installs the chart)."""

    def kill(self, pod: str) -> None:
        """A crash as a real cluster can deal it: the pod is removed at once, without a grace
        period (the runtime image has no `kill`, and PID 1 ignores signals sent from inside);
        its controller makes a new one."""
        self.kubectl("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")

    def seed_model(self, claim: str) -> str:
        return "/opt/rlkube/models/tiny-reverse-text"  # made in the runtime image

    def read_file(self, claim: str, path: str) -> str | None:
        overrides = {"spec": {
            "containers": [{"name": "read", "image": "busybox:1.36", "command": ["cat", f"/mnt/{path}"],
                            "volumeMounts": [{"name": "claim", "mountPath": "/mnt"}]}],
            "volumes": [{"name": "claim", "persistentVolumeClaim": {"claimName": claim}}],
        }}
        out = self.kubectl("run", f"read-{int(time.time())}", "--rm", "-i", "--restart=Never",
                           "--image=busybox:1.36", f"--overrides={json.dumps(overrides)}", check=False,
                           timeout=180)
        return out or None

    @property
    def host_address(self) -> str:
        raise ClusterError("the object-store scenario needs a bucket reachable from the cluster: "
                           "set RLKUBE_E2E_S3_URL (not implemented for real clusters yet)")
