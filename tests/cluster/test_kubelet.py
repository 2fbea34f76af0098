"""The local cluster's kubelet against its API server (no controllers): pods are real processes
in their own network namespaces, reachable at their IPs, resolving Services through their
hosts files."""

import asyncio
import base64
import contextlib
import functools
import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from e2e.localcluster.kubelet import Kubelet, log_path
from e2e.localcluster.network import NETNS_ETC, RECORDS, Network, unavailable_reason
from tests.fixtures.prerequisites import require
from tests.operator.cluster import NS, ApiServer, Cluster

PY = sys.executable


@pytest.fixture
def kmock_options():
    return {"cls": ApiServer}


@contextlib.asynccontextmanager
async def kubelet_cluster(kmock, tmp_path: Path, **options):
    """The API server with a running kubelet (`Kubelet(**options)`); `cluster.kubelet`,
    `cluster.logs(pod)` (the file the API server serves `kubectl logs` from; `previous=True`:
    `--previous`)."""
    require(unavailable_reason())
    kubelet = Kubelet(str(kmock.url), tmp_path, Path(PY).parents[1], backoff_s=0.5, backoff_cap_s=1, **options)
    task = asyncio.create_task(kubelet.run())
    ready = asyncio.create_task(kubelet.ready.wait())
    await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        task.result()
    try:
        async with Cluster(kmock) as cluster:
            cluster.kubelet = kubelet
            kmock.logs = functools.partial(log_path, tmp_path)
            cluster.logs = lambda pod, c="main", previous=False: _read(kmock.log_file(cluster.get("Pod", pod), c, previous))
            yield cluster
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kubelet.shutdown()


@pytest.fixture
async def cluster(kmock, tmp_path):
    """The kubelet with the venv standing in for every image."""
    async with kubelet_cluster(kmock, tmp_path) as cluster:
        yield cluster


def _read(path: Path | None) -> str:
    return path.read_text() if path and path.exists() else ""


def pod(name: str, command: list[str] | None, labels: dict | None = None, policy: str = "Never", **extra) -> dict:
    """A pod of one container, `main`; no `command`: the image's."""
    container = {"name": "main", "image": "venv"} | ({"command": command} if command else {})
    container.update(extra.pop("container", {}))
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {"restartPolicy": policy, "containers": [container], **extra},
    }


def http_server(port: int = 8080) -> dict:
    return {"ports": [{"name": "http", "containerPort": port}],
            "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}}


def service(name: str, selector: dict, headless: bool, **spec) -> dict:
    return {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
        "spec": {"clusterIP": "None" if headless else "10.96.0.10", "selector": selector,
                 "ports": [{"port": 8080, "targetPort": 8080}], **spec},
    }


def is_ready(c: Cluster, name: str) -> bool:
    return any(x["type"] == "Ready" and x["status"] == "True" for x in c.status("Pod", name)["conditions"])


def phase(c: Cluster, name: str) -> str | None:
    return c.status("Pod", name).get("phase")


def main_status(c: Cluster, name: str) -> dict:
    return c.status("Pod", name)["containerStatuses"][0]


def ip_out(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def http_get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status


async def test_pod_serves_on_its_ip_and_pods_resolve_each_other(cluster):
    labels = {"group": "peers"}
    await cluster.create(service("peers", labels, headless=True, publishNotReadyAddresses=True))
    await cluster.create(pod("a", ["python", "-m", "http.server", "8080"], labels,
                             hostname="a", subdomain="peers", container=http_server()))
    resolve = (
        "import socket, time, urllib.request\n"
        "time.sleep(1)\n"
        "for name in ['a.peers', 'peers', 'peers.team-a.svc.cluster.local', 'b.peers.team-a.svc']:\n"
        "    print(name, socket.gethostbyname(name), flush=True)\n"
        "print('status', urllib.request.urlopen('http://a.peers:8080/', timeout=5).status, flush=True)\n"
    )
    await cluster.create(pod("b", ["python", "-c", resolve], labels, hostname="b", subdomain="peers"))

    await cluster.until(lambda: is_ready(cluster, "a"), 30, "pod a ready")
    ip_a = cluster.status("Pod", "a")["podIP"]
    assert cluster.get("Pod", "a")["spec"]["nodeName"] == "local"
    assert await asyncio.to_thread(http_get, f"http://{ip_a}:8080/") == 200  # from the host side

    await cluster.until(lambda: phase(cluster, "b") in ("Succeeded", "Failed"), 30, "pod b to end")
    out = cluster.logs("b")
    assert phase(cluster, "b") == "Succeeded", out
    lines = dict(line.split(" ", 1) for line in out.splitlines())
    ip_b = cluster.status("Pod", "b")["podIP"]
    assert lines["a.peers"] == ip_a
    assert lines["peers"] in (ip_a, ip_b)
    assert lines["b.peers.team-a.svc"] == ip_b
    assert lines["status"] == "200"


async def test_cluster_ip_service_follows_a_replaced_pod_in_a_running_process(cluster):
    await cluster.create(service("api", {"app": "server"}, headless=False))
    await cluster.create(pod("server-1", ["python", "-m", "http.server", "8080"], {"app": "server"},
                             container=http_server()))
    watch = (
        "import socket, time\n"
        "while True:\n"
        "    try: print(socket.gethostbyname('api'), flush=True)\n"
        "    except OSError as e: print('unresolved', e, flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    await cluster.create(pod("client", ["python", "-c", watch]))
    await cluster.until(lambda: is_ready(cluster, "server-1"), 30, "server-1 ready")
    ip_1 = cluster.status("Pod", "server-1")["podIP"]
    await cluster.until(lambda: ip_1 in cluster.logs("client"), 30, "client resolving server-1")

    await cluster.delete("Pod", "server-1")  # marked: the kubelet stops it, then deletes it
    await cluster.create(pod("server-2", ["python", "-m", "http.server", "8080"], {"app": "server"},
                             container=http_server()))
    await cluster.until(lambda: is_ready(cluster, "server-2"), 30, "server-2 ready")
    ip_2 = cluster.status("Pod", "server-2")["podIP"]
    assert ip_2 != ip_1
    await cluster.until(lambda: ip_2 in cluster.logs("client").splitlines()[-1], 30, "client following")
    assert main_status(cluster, "client")["restartCount"] == 0


async def test_volumes_and_env_and_cleanup(cluster, tmp_path):
    await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                          "data": {"run.toml": "steps = 3\n", "unused": "x"}})
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "creds", "namespace": NS},
              "data": {"ACCESS_KEY": base64.b64encode(b"key-1").decode()}}
    await cluster.create(secret)
    await cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared"},
                          "spec": {"accessModes": ["ReadWriteOnce"]}})
    volumes = [
        {"name": "config", "configMap": {"name": "cfg", "items": [{"key": "run.toml", "path": "run.toml"}]}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts = [{"name": "config", "mountPath": "/etc/rlkube-kubelet-test", "readOnly": True},
              {"name": "data", "mountPath": "/rlkube-kubelet-test/data"},
              {"name": "tmp", "mountPath": "/tmp"}]
    env = [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "STEPS_FILE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "run.toml"}}},
        {"name": "GREETING", "value": "hello $(POD) of $(TEAM), $$(POD) stays"},
    ]
    writer = (
        "import os, pathlib, sys\n"
        "print(sys.argv[1:], os.environ['GREETING'], os.environ['IP'], os.environ['S3_ACCESS_KEY'], flush=True)\n"
        "pathlib.Path('/tmp/kubelet-test-marker').write_text('private')\n"
        "cfg = pathlib.Path('/etc/rlkube-kubelet-test/run.toml').read_text()\n"
        "pathlib.Path('/rlkube-kubelet-test/data/copy.toml').write_text(cfg + os.environ['STEPS_FILE'])\n"
        "try: pathlib.Path('/etc/rlkube-kubelet-test/x').write_text('no')\n"
        "except OSError: print('read-only', flush=True)\n"
    )
    spec = {"env": env, "envFrom": [{"secretRef": {"name": "creds"}, "prefix": "S3_"}],
            "volumeMounts": mounts, "args": ["$(POD)", "--at", "$(IP)"]}
    await cluster.create(pod("writer", ["python", "-c", writer], {"team": "rl"}, volumes=volumes, container=spec))
    reader = "import pathlib; print(pathlib.Path('/rlkube-kubelet-test/data/copy.toml').read_text(), end='')"
    await cluster.until(lambda: phase(cluster, "writer") in ("Succeeded", "Failed"), 30, "writer to end")
    assert phase(cluster, "writer") == "Succeeded", cluster.logs("writer")
    await cluster.create(pod("reader", ["python", "-c", reader], volumes=volumes, container={"volumeMounts": mounts}))
    await cluster.until(lambda: phase(cluster, "reader") in ("Succeeded", "Failed"), 30, "reader to end")

    ip = cluster.status("Pod", "writer")["podIP"]
    assert cluster.logs("writer").splitlines() == [
        f"['writer', '--at', '{ip}'] hello writer of rl, $(POD) stays {ip} key-1", "read-only"]
    assert cluster.logs("reader") == "steps = 3\nsteps = 3\n"
    assert (tmp_path / "pvcs" / NS / "shared" / "copy.toml").exists()
    assert not Path("/tmp/kubelet-test-marker").exists()  # the pod's /tmp was its emptyDir
    assert Path("/etc/rlkube-kubelet-test").is_dir()  # a mount target the kubelet had to make

    run_id = cluster.kubelet.network.footprint.run_id
    await cluster.kubelet.shutdown()
    assert not Path("/etc/rlkube-kubelet-test").exists()
    assert not Path("/rlkube-kubelet-test").exists()
    assert f"rlk-{run_id}" not in ip_out("netns", "list")
    assert f"rlk{run_id}" not in ip_out("link")
    assert not list(NETNS_ETC.glob(f"rlk-{run_id}-*"))


async def test_a_dead_runs_leftover_mount_target_is_kept_while_a_pod_mounts_on_it(cluster):
    """A mount target (`/data` for a claim) that a dead run recorded and left behind, on which a
    live run's pod then mounts, is co-owned by the live run: the next run's removal of the dead
    run's leftovers leaves it (removing the host's empty directory detached the pods' mounts on
    it, and a trainer saving its checkpoint met a read-only `/data`)."""
    target = Path("/rlkube-kubelet-leftover")
    dead = await asyncio.create_subprocess_exec("true")
    await dead.wait()
    record = RECORDS / f"dead{dead.pid:x}.json"
    target.mkdir()
    record.write_text(json.dumps({"pid": dead.pid, "paths": [str(target)]}))
    try:
        volumes = [{"name": "scratch", "emptyDir": {}}]
        mounts = [{"name": "scratch", "mountPath": str(target)}]
        await cluster.create(pod("mounts", ["sleep", "300"], volumes=volumes, container={"volumeMounts": mounts}))
        await cluster.until(lambda: phase(cluster, "mounts") == "Running", 30, "pod `mounts` Running")
        # what the next run's start does, in a process of its own (this one's runs are its own)
        removal = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from e2e.localcluster.network import remove_stale_runs as r; r()",
            cwd=Path(__file__).parents[2])
        assert await asyncio.wait_for(removal.wait(), 60) == 0
        assert target.is_dir(), "the dead run's leftover was removed under a live pod's mount"
        assert str(target) in cluster.kubelet.network.footprint.paths
    finally:
        record.unlink(missing_ok=True)


async def test_crashing_container_backs_off_and_restarts(cluster):
    await cluster.create(pod("crash", ["sh", "-c", "echo started; exit 3"], policy="Always"))
    await cluster.create(pod("once", ["sh", "-c", "exit 3"], policy="Never"))
    await cluster.until(
        lambda: main_status(cluster, "crash")["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff",
        30, "CrashLoopBackOff")
    await cluster.until(lambda: main_status(cluster, "crash")["restartCount"] >= 2, 30, "two restarts")
    status = main_status(cluster, "crash")
    assert status["lastState"]["terminated"]["exitCode"] == 3
    assert phase(cluster, "crash") == "Running"
    await cluster.until(lambda: cluster.logs("crash") == cluster.logs("crash", previous=True) == "started\n", 30,
                        "each run's output in a log of its own")

    await cluster.until(lambda: phase(cluster, "once") == "Failed", 30, "pod `once` Failed")
    assert main_status(cluster, "once")["state"]["terminated"]["exitCode"] == 3
    assert main_status(cluster, "once")["restartCount"] == 0


async def test_failing_liveness_probe_restarts_the_container(cluster):
    container = http_server() | {"livenessProbe": {"httpGet": {"path": "/missing", "port": 8080},
                                                    "periodSeconds": 1, "failureThreshold": 2}}
    await cluster.create(pod("sick", ["python", "-m", "http.server", "8080"], policy="Always",
                             terminationGracePeriodSeconds=2, container=container))
    await cluster.until(lambda: main_status(cluster, "sick")["restartCount"] >= 1, 60, "a liveness restart")
    assert "terminated" in main_status(cluster, "sick")["lastState"]


async def test_graceful_delete_sends_sigterm_then_the_kubelet_deletes_the_pod(cluster, kmock):
    script = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    print('got SIGTERM', flush=True); time.sleep(0.5); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('up', flush=True)\n"
        "while True: time.sleep(1)\n"
    )
    # The finalizer keeps the pod after the kubelet's final DELETE, for the test to look at.
    held = pod("graceful", ["python", "-c", script], terminationGracePeriodSeconds=20)
    held["metadata"]["finalizers"] = ["rlkube.dev/test-hold"]
    await cluster.create(held)
    await cluster.until(lambda: "up" in cluster.logs("graceful"), 30, "process up")
    netns = next(r.net.netns for r in cluster.kubelet.pods.values() if r.name == "graceful")

    await cluster.delete("Pod", "graceful")  # marks it: deletionTimestamp
    await cluster.until(lambda: any(r.params.get("gracePeriodSeconds") == "0" for r in kmock
                                    if r.method == kmock.method.DELETE), 30, "the kubelet's final DELETE")
    assert cluster.logs("graceful").splitlines() == ["up", "got SIGTERM"]
    assert netns not in ip_out("netns", "list")


async def test_startup_tcp_and_exec_readiness_probes_gate_readiness(cluster):
    # The exec probe dials the pod's own loopback: it passes only inside the pod's namespace.
    dial = ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', 8765), timeout=1)"]
    container = {
        "startupProbe": {"tcpSocket": {"port": 8765}, "periodSeconds": 1, "failureThreshold": 30},
        "readinessProbe": {"exec": {"command": dial}, "periodSeconds": 1},
    }
    await cluster.create(pod("slow", ["sh", "-c", "sleep 2; exec python -m http.server 8765"],
                             policy="Always", container=container))
    await cluster.until(lambda: main_status(cluster, "slow")["state"].get("running"), 30, "running")
    assert not main_status(cluster, "slow")["started"]  # the server sleeps 2 s before listening
    await cluster.until(lambda: is_ready(cluster, "slow"), 30, "ready through the probes")
    assert main_status(cluster, "slow")["started"]
    assert main_status(cluster, "slow")["restartCount"] == 0


async def test_missing_config_map_holds_the_container_until_it_exists(cluster):
    env = [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "late", "key": "mode"}}}]
    await cluster.create(pod("waits", ["sh", "-c", "echo mode=$MODE"], container={"env": env}))
    await cluster.until(
        lambda: main_status(cluster, "waits")["state"]["waiting"]["reason"] == "CreateContainerConfigError",
        30, "CreateContainerConfigError")
    assert phase(cluster, "waits") == "Pending"
    await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "late"},
                          "data": {"mode": "fast"}})
    await cluster.until(lambda: phase(cluster, "waits") == "Succeeded", 30, "the pod to run")
    assert cluster.logs("waits") == "mode=fast\n"


def test_leftovers_of_a_dead_run_are_removed_and_nothing_else(tmp_path):
    require(unavailable_reason())
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, foreign = "dead001", "alien01"
    stale_dir = Path("/rlkube-kubelet-stale")
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{stale}.json").write_text(json.dumps({"pid": dead.pid, "paths": [str(stale_dir)]}))
    stale_dir.mkdir()
    for run_id in (stale, foreign):
        ip_out("netns", "add", f"rlk-{run_id}-1")
        ip_out("link", "add", f"rlk{run_id}", "type", "bridge")
    sleeper = subprocess.Popen(["ip", "netns", "exec", f"rlk-{stale}-1", "sleep", "300"], start_new_session=True)
    try:
        network = Network()
        network.close()
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert f"rlk-{stale}-1" not in ip_out("netns", "list")
        assert f"rlk{stale}" not in ip_out("link")
        assert not stale_dir.exists()
        assert not (RECORDS / f"{stale}.json").exists()
        assert f"rlk-{foreign}-1" in ip_out("netns", "list")  # no record: not ours to touch
        assert f"rlk{foreign}" in ip_out("link")
    finally:
        sleeper.kill()
        ip_out("netns", "del", f"rlk-{foreign}-1")
        ip_out("link", "del", f"rlk{foreign}")


async def test_a_process_ignoring_sigterm_is_killed_after_the_grace_period(cluster, kmock):
    stubborn = pod("stubborn", ["sh", "-c", "trap '' TERM; echo up; sleep 300"], terminationGracePeriodSeconds=1)
    stubborn["metadata"]["finalizers"] = ["rlkube.dev/test-hold"]  # see the graceful-delete test
    await cluster.create(stubborn)
    await cluster.until(lambda: "up" in cluster.logs("stubborn"), 30, "process up")
    pid = int(main_status(cluster, "stubborn")["containerID"].removeprefix("localcluster://"))

    await cluster.delete("Pod", "stubborn")
    await cluster.until(lambda: any(r.params.get("gracePeriodSeconds") == "0" for r in kmock
                                    if r.method == kmock.method.DELETE), 30, "the kubelet's final DELETE")
    assert not Path(f"/proc/{pid}").exists()


async def test_a_terminating_pod_resolves_until_it_is_gone_only_where_not_ready_pods_are_published(cluster, kmock):
    """As an EndpointSlice keeps a terminating pod for a Service with `publishNotReadyAddresses`
    (and only there) during its grace period: a new pod may still reach the old one by name."""
    labels = {"role": "master"}
    await cluster.create(service("master", labels, headless=True, publishNotReadyAddresses=True))
    await cluster.create(service("ready-only", labels, headless=True))
    old = pod("old", ["sh", "-c", "trap '' TERM; echo up; sleep 300"], labels, terminationGracePeriodSeconds=4)
    old["metadata"]["finalizers"] = ["rlkube.dev/test-hold"]  # see the graceful-delete test
    await cluster.create(old)
    watch = (
        "import socket, time\n"
        "while True:\n"
        "    for name in ('master', 'ready-only'):\n"
        "        try: print(name, socket.gethostbyname(name), flush=True)\n"
        "        except OSError: print(name, 'unresolved', flush=True)\n"
        "    time.sleep(0.2)\n"
    )
    await cluster.create(pod("watcher", ["python", "-c", watch]))
    await cluster.until(lambda: "up" in cluster.logs("old"), 30, "old pod up")
    ip_old = cluster.status("Pod", "old")["podIP"]
    await cluster.until(lambda: f"master {ip_old}" in cluster.logs("watcher"), 30, "the watcher resolving the old pod")

    await cluster.delete("Pod", "old")
    await cluster.until(lambda: "ready-only unresolved" in cluster.logs("watcher"), 10,
                        "the terminating pod gone from the Service that publishes ready pods only")
    await asyncio.sleep(1)  # the grace period (4 s) is not over: its process still runs
    assert cluster.logs("watcher").splitlines()[-2:] in (
        [f"master {ip_old}", "ready-only unresolved"], ["ready-only unresolved", f"master {ip_old}"])
    await cluster.until(lambda: any(r.params.get("gracePeriodSeconds") == "0" for r in kmock
                                    if r.method == kmock.method.DELETE), 30, "the kubelet's final DELETE")
    await cluster.until(lambda: "master unresolved" in cluster.logs("watcher"), 10, "the old pod gone from DNS")


def test_a_volume_over_the_images_directory_does_not_hide_the_image(tmp_path):
    """The checkout and its venv stand in for the image; an emptyDir mounted on a directory
    holding them (`/tmp` of a checkout under `/tmp`) must not hide the container's program."""
    from e2e.localcluster.kubelet import LAUNCH

    require(unavailable_reason())
    image, empty = tmp_path / "checkout" / "bin", tmp_path.parent / f"{tmp_path.name}-empty"
    image.mkdir(parents=True)
    empty.mkdir()
    (image / "program").write_text("#!/bin/sh\necho from the image\n")
    (image / "program").chmod(0o755)
    spec = tmp_path.parent / f"{tmp_path.name}-spec.json"
    spec.write_text(json.dumps({
        "argv": [str(image / "program")], "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/", "hostname": "pod",
        "mounts": [{"source": str(empty), "target": str(tmp_path), "read_only": False}],
        "image": [str(tmp_path / "checkout")],
    }))
    run = subprocess.run([PY, str(LAUNCH), str(spec)], check=False, capture_output=True, text=True, timeout=30)
    assert (run.returncode, run.stdout) == (0, "from the image\n"), run.stderr


RESTRICTED_POD = {"runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
                  "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True}


async def test_a_pod_runs_as_its_security_context_on_a_read_only_root(cluster, tmp_path):
    """uid/gid 1000 with fsGroup as a supplementary group, no capabilities, no_new_privs; the
    root filesystem read-only, the emptyDir and the claim (root's files, before fsGroup) writable."""
    await cluster.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "claim"},
                          "spec": {"accessModes": ["ReadWriteOnce"]}})
    seeded = tmp_path / "pvcs" / NS / "claim" / "models"
    seeded.mkdir(parents=True)
    (seeded / "config.json").write_text("{}")  # what root put there, 0644 in a 0755 directory
    probe = (
        "import os, subprocess\n"
        "print('id', subprocess.run(['id', '-u'], capture_output=True, text=True).stdout.strip(),"
        " os.getgid(), sorted(os.getgroups()), flush=True)\n"
        "status = dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "print('caps', status['CapEff'].strip(), status['CapBnd'].strip(), 'nnp', status['NoNewPrivs'].strip())\n"
        "print('root read-only', bool(os.statvfs('/').f_flag & os.ST_RDONLY), flush=True)\n"
        "for path in ('/tmp/x', '/data/models/out', '/data/models/config.json', '/var/x'):\n"
        "    try:\n"
        "        open(path, 'a').close(); print('wrote', path)\n"
        "    except OSError as e: print('refused', path, e.strerror)\n"
    )
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "claim"}}, {"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"}]
    await cluster.create(pod("restricted", ["python", "-c", probe], volumes=volumes, securityContext=RESTRICTED_POD,
                             container={"volumeMounts": mounts, "securityContext": RESTRICTED_CONTAINER}))
    await cluster.until(lambda: phase(cluster, "restricted") in ("Succeeded", "Failed"), 30, "the pod to end")
    out = cluster.logs("restricted").splitlines()
    assert phase(cluster, "restricted") == "Succeeded", out
    assert out == [
        "id 1000 1000 [1000]",
        "caps 0000000000000000 0000000000000000 nnp 1",
        "root read-only True",
        "wrote /tmp/x", "wrote /data/models/out", "wrote /data/models/config.json",
        "refused /var/x Read-only file system",
    ]
    assert (seeded / "out").stat().st_gid == 1000  # new files stay in the fsGroup
    assert not Path("/var/x").exists()


async def test_run_as_non_root_without_a_user_is_refused_like_a_kubelet_does(cluster):
    await cluster.create(pod("rootful", ["true"], securityContext={"runAsNonRoot": True}))
    await cluster.until(lambda: main_status(cluster, "rootful")["state"].get("waiting", {}).get("reason")
                        == "CreateContainerConfigError", 30, "the container refused")
    assert "runAsNonRoot" in main_status(cluster, "rootful")["state"]["waiting"]["message"]


async def test_the_termination_message_is_the_runtimes_error_or_the_logs_tail(cluster):
    """The runtime's own error reaches the pod's status through /dev/termination-log (the real
    `rlkube` entrypoint, exit code 2); a crash that wrote none leaves its log's tail only under
    `FallbackToLogsOnError`, as the kubelet does."""
    fallback = {"terminationMessagePolicy": "FallbackToLogsOnError"}
    await cluster.create(pod("invalid", ["rlkube", "trainer", "--model.name", "/nowhere/model"], container=fallback))
    await cluster.create(pod("crash", ["sh", "-c", "echo loading; echo 'boom: no GPU' >&2; exit 3"], container=fallback))
    await cluster.create(pod("quiet", ["sh", "-c", "echo loading; exit 3"]))
    for name in ("invalid", "crash", "quiet"):
        await cluster.until(lambda name=name: phase(cluster, name) == "Failed", 30, f"pod {name} Failed")
    invalid = main_status(cluster, "invalid")["state"]["terminated"]
    assert invalid["exitCode"] == 2
    assert invalid["message"].startswith("rlkube trainer: error: invalid config:\n  model.name: '/nowhere/model'")
    assert main_status(cluster, "crash")["state"]["terminated"]["message"] == "loading\nboom: no GPU"
    assert "message" not in main_status(cluster, "quiet")["state"]["terminated"]


def test_an_image_under_a_directory_the_user_may_not_enter_still_runs(tmp_path):
    """A checkout or Python under root's 0700 home, as CI machines have them: the pod's user
    gets the image's paths, and nothing else of that directory."""
    from e2e.localcluster.kubelet import LAUNCH

    require(unavailable_reason())
    tmp_path.chmod(0o755)
    closed = tmp_path / "home"
    image = closed / "checkout" / "bin"
    image.mkdir(parents=True)
    closed.chmod(0o700)
    (closed / "private").write_text("root's")
    (image / "program").write_text("#!/bin/sh\nid -u; ls $(dirname $0)/../..; cat $(dirname $0)/../../private\n")
    (image / "program").chmod(0o755)
    spec = tmp_path / "spec.json"
    identity = {"uid": 1000, "gid": 1000, "groups": [1000], "no_new_privs": True, "drop_all_capabilities": True,
                "read_only_root": True}
    spec.write_text(json.dumps({
        "argv": [str(image / "program")], "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/", "hostname": "pod",
        "mounts": [], "image": [str(closed / "checkout")], "identity": identity,
    }))
    run = subprocess.run([PY, str(LAUNCH), str(spec)], check=False, capture_output=True, text=True, timeout=30)
    assert run.stdout == "1000\ncheckout\n", run.stderr
    assert "private: No such file" in run.stderr
    assert (closed / "private").read_text() == "root's"  # covered in the pod only


async def test_a_running_pod_sees_its_config_maps_change(cluster):
    """A ConfigMap volume's keys follow the ConfigMap while the pod runs (what the orchestrator's
    `client.base_urls_file` relies on for `kubectl scale rlrun`), each file replaced whole."""
    await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "urls"},
                          "data": {"inference_urls": "a\n"}})
    watcher = ("import time, pathlib\nf = pathlib.Path('/etc/c/inference_urls')\nseen = ''\n"
               "while seen != 'a\\nb\\n':\n    text = f.read_text()\n    if text != seen: print(repr(text), flush=True)\n"
               "    seen = text\n    time.sleep(0.05)\n")
    volumes = [{"name": "c", "configMap": {"name": "urls", "items": [{"key": "inference_urls", "path": "inference_urls"}]}}]
    mounts = [{"name": "c", "mountPath": "/etc/c", "readOnly": True}]
    await cluster.create(pod("reads", [PY, "-c", watcher], volumes=volumes, container={"volumeMounts": mounts}))
    await cluster.until(lambda: "'a\\n'" in cluster.logs("reads"), 30, "the first text")
    await cluster.patch("ConfigMap", "urls", {"data": {"inference_urls": "a\nb\n"}})
    await cluster.until(lambda: phase(cluster, "reads") == "Succeeded", 30, "the pod to see the new text")
    assert cluster.logs("reads").splitlines() == ["'a\\n'", "'a\\nb\\n'"]
