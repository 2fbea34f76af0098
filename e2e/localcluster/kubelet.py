"""The local cluster's kubelet: every Pod in the API runs as real processes on this machine.

There is one node, `local`, and no scheduler: the kubelet takes every Pod, sets `spec.nodeName`,
gives it a network namespace and an IP (network.py), makes its volumes (volumes.py), and starts
each container's `command` + `args` (podenv.py) through launch.py, inside the pod's network
namespace and a private mount namespace where the volumes sit at their mountPath. Its files come
from its image (images.py): with `images=PodmanImages()` (`up --images podman`), the image named by
`spec.image` in this node's podman store, mounted as the container's root filesystem under a
writable layer of its own, its ENTRYPOINT/CMD, ENV, USER and WORKDIR filling what the spec leaves
out; an image not in the store leaves the container waiting in ErrImagePull/ImagePullBackOff. By
default (`VenvImage`, the fast tests) the project's virtualenv stands in for every image:
`<venv>/bin` leads PATH (`<repo>/.venv`, or `$RLKUBE_LOCALCLUSTER_VENV`), the default working
directory is a per-pod scratch directory, and the checkout, the venv and the Python it was made
from must be readable by the pod's user; a directory above them it may not enter (root's 0700
home) is covered in the pod by a tmpfs holding only them (launch.py). Processes run as the
securityContext says (podenv.identity): `runAsUser`/`runAsGroup`, `fsGroup` owning the volumes
(volumes.py), a read-only root filesystem, no capabilities, no privilege escalation.

Reported in `status`: phase (Pending, Running, Succeeded, Failed), hostIP, podIP(s), startTime,
conditions PodScheduled/Initialized/ContainersReady/Ready, containerStatuses (state
waiting/running/terminated with reason ContainerCreating, CreateContainerConfigError,
ErrImagePull, ImagePullBackOff, CrashLoopBackOff, Completed, Error; lastState, restartCount, ready, started). A terminated state
carries the termination message: what the container wrote to its `terminationMessagePath` (a
file of its own bound there), or its log's tail under `FallbackToLogsOnError`. Restarts follow
`restartPolicy` with exponential back-off (`backoff_s` doubling up to `backoff_cap_s`, reset
after a container ran ten minutes). Probes: probes.py.

Deletion: a Pod with `metadata.deletionTimestamp` gets SIGTERM to each container's process
group, `deletionGracePeriodSeconds` (else `terminationGracePeriodSeconds`, else 30 s) to exit,
then SIGKILL; its namespace is removed and the kubelet deletes the object with
`gracePeriodSeconds=0` (preconditions: its uid). A Pod gone from the API is killed at once.
Every container runs in its own session, so its children die with it, and whatever is left in
the pod's network namespace is killed when the pod ends.

Logs: one file per run of a container, `<state_dir>/logs/<namespace>_<pod>_<uid>_<container>_<run>.log`
(see `log_path`), stdout and stderr together; the API server serves the current run for `kubectl
logs` and the one before for `--previous`. A restart or a pod recreated under the same name writes
a new file, so its predecessor's stays, as under a kubelet's /var/log/pods.

Not emulated: init and ephemeral containers, lifecycle hooks, resource limits (no OOMKilled),
pulling images (a registry), seccomp and added capabilities, the Binding API.
"""

import asyncio
import datetime
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path

import aiohttp

from e2e.localcluster import probes, volumes
from e2e.localcluster.client import Api
from e2e.localcluster.images import Image, ImageNotPresent, PodmanImages, VenvImage
from e2e.localcluster.netpolicy import Fences, Member
from e2e.localcluster.network import Endpoint, Network, PodNet, hosts_file, write_in_place
from e2e.localcluster.podenv import ConfigError, command_line, container_env, identity

log = logging.getLogger(__name__)

LAUNCH = Path(__file__).with_name("launch.py")
BACKOFF_RESET_S = 600
TERMINATION_LOG = "/dev/termination-log"
"""A container's default `terminationMessagePath`: a file of its own, bound there."""


def log_path(state_dir: Path, namespace: str, pod: str, uid: str, container: str, run: int) -> Path:
    """Where run `run` of a container logs (its restart count when it started)."""
    return Path(state_dir) / "logs" / f"{namespace}_{pod}_{uid}_{container}_{run}.log"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Kubelet:
    """Runs every Pod of the API server at `api_url` until cancelled; then `shutdown()`.

    `state_dir` holds per-pod files, volumes, PVC directories and logs. `backoff_s`/`backoff_cap_s`
    set the restart and image back-off (Kubernetes: 10 s doubling to 300 s). `images`: where
    containers' files come from (images.py); by default the stand-in, `VenvImage(venv)`."""

    def __init__(self, api_url: str, state_dir: Path, venv: Path | None = None, *,
                 node_name: str = "local", poll_s: float = 0.3, backoff_s: float = 10.0,
                 backoff_cap_s: float = 40.0, image_env: dict[str, str] | None = None,
                 images: PodmanImages | VenvImage | None = None):
        self.api = Api(api_url)
        self.state_dir = Path(state_dir)
        self.images = images or VenvImage(venv)
        self.node_name = node_name
        self.poll_s = poll_s
        self.backoff_s, self.backoff_cap_s = backoff_s, backoff_cap_s
        self.image_env = image_env or {}
        self.network: Network | None = None
        self.pods: dict[str, PodRunner] = {}
        self.ended: set[str] = set()
        self.services: list[dict] = []
        self.fences = Fences()  # NetworkPolicy ingress (netpolicy.py)
        self.ready = asyncio.Event()  # set once the network is up and the first sync is done
        self._loop_task: asyncio.Task | None = None

    async def run(self) -> None:
        """Set up the network (raises NetworkUnavailable where it cannot be made), then sync
        the pods with the API every `poll_s` until cancelled."""
        self._loop_task = asyncio.current_task()
        self.network = Network()
        while True:
            try:
                await self.sync()
                self.ready.set()
            except (aiohttp.ClientError, OSError) as e:
                log.warning("kubelet sync failed: %s", e)
            await asyncio.sleep(self.poll_s)

    async def sync(self) -> None:
        pods = await self.api.list(self.api.core("pods"))
        self.services = await self.api.list(self.api.core("services"))
        self.fences.policies = await self.api.list(self.api.kind("networking.k8s.io/v1", "NetworkPolicy"))
        self.fences.namespaces = {n["metadata"]["name"]: n for n in await self.api.list(self.api.core("namespaces"))}
        for svc in self.services:
            _warn_unproxied_ports(svc)
        present = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            present.add(uid)
            runner = self.pods.get(uid)
            if runner is None:
                if uid in self.ended or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue  # a pod runs once; one that ended before this kubelet stays ended
                runner = self.pods[uid] = PodRunner(self, pod)
                runner.task.add_done_callback(lambda _, uid=uid: self._ended(uid))
            runner.pod = pod
            if pod["metadata"].get("deletionTimestamp"):
                runner.request_stop(_grace(pod))
        for uid, runner in self.pods.items():
            if uid not in present:
                runner.request_stop(0, vanished=True)
        self.update_dns()
        await self.update_fences()
        configmaps = {(c["metadata"]["namespace"], c["metadata"]["name"]): c
                      for c in await self.api.list(self.api.core("configmaps"))}
        for runner in self.pods.values():
            if runner.volumes is not None and not runner.finished:
                volumes.refresh_configmaps(runner.pod, runner.volumes, configmaps)

    def _ended(self, uid: str) -> None:
        self.ended.add(uid)
        runner = self.pods.pop(uid, None)
        if runner and not runner.task.cancelled() and runner.task.exception():
            log.error("pod %s/%s: kubelet error %r", runner.ns, runner.name, runner.task.exception())

    def update_dns(self) -> None:
        """Rewrite every running pod's hosts file from the current pods and Services. A pod in
        its grace period still counts (not ready: only `publishNotReadyAddresses` Services keep
        it, as EndpointSlices do) until its processes are gone."""
        runners = [r for r in self.pods.values() if r.net and not r.finished]
        endpoints = [Endpoint(r.pod, r.net.ip, r.ready) for r in runners]
        for r, own in zip(runners, endpoints):
            hosts = hosts_file(own, endpoints, self.services)
            if hosts != r.hosts:
                r.hosts = hosts
                write_in_place(r.net.hosts_file, hosts)

    async def update_fences(self) -> None:
        """Every running pod's ingress rules as the NetworkPolicies say (netpolicy.py)."""
        await self.fences.update([(Member(r.pod, r.net.ip), r.net.netns) for r in self.pods.values()
                                  if r.net and not r.finished], self.network.host_ip)

    async def shutdown(self, grace_s: float = 2.0) -> None:
        """Stop syncing, stop every pod (SIGTERM, `grace_s`, SIGKILL) and remove the network;
        no API calls. Safe to call more than once."""
        if self._loop_task and self._loop_task is not asyncio.current_task():
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        runners = list(self.pods.values())
        for r in runners:
            r.request_stop(grace_s, vanished=True)
        await asyncio.gather(*(r.task for r in runners), return_exceptions=True)
        self.pods.clear()
        if self.network:
            self.network.close()
            self.network = None
        self.images.close()
        await self.api.close()


_warned: set[str] = set()


def _warn_unproxied_ports(svc: dict) -> None:
    """Without kube-proxy a ClusterIP name resolves to a pod: `port` must be the pod's port."""
    spec, uid = svc.get("spec", {}), svc["metadata"].get("uid", svc["metadata"]["name"])
    if spec.get("clusterIP") == "None" or uid in _warned:
        return
    for port in spec.get("ports") or []:
        if port.get("targetPort", port["port"]) != port["port"]:
            _warned.add(uid)
            log.warning("service %s/%s: port %s != targetPort %s; the local cluster has no "
                        "kube-proxy, clients reach the pod on %s", svc["metadata"].get("namespace"),
                        svc["metadata"]["name"], port["port"], port["targetPort"], port["port"])


def _grace(pod: dict) -> float:
    meta_grace = pod["metadata"].get("deletionGracePeriodSeconds")
    return float(meta_grace if meta_grace is not None else pod["spec"].get("terminationGracePeriodSeconds", 30))


class PodRunner:
    """One pod from its first sync to its deletion."""

    def __init__(self, kubelet: Kubelet, pod: dict):
        self.kubelet = kubelet
        self.pod = pod
        self.ns, self.name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.dir = kubelet.state_dir / "pods" / f"{self.ns}_{self.name}_{pod['metadata']['uid'][:8]}"
        self.net: PodNet | None = None
        self.hosts = ""
        self.start_time: str | None = None
        self.containers = [ContainerRunner(self, c) for c in pod["spec"]["containers"]]
        self.finished = False  # every container is done for good (Succeeded/Failed)
        self.stopping = False
        self.grace = 0.0
        self.vanished = False
        self.stop_requested = asyncio.Event()
        self.kill_now = asyncio.Event()  # cuts a grace period short
        self.volumes: dict[str, Path] | None = None  # volume name -> host path, once made
        self._transitions: dict[str, tuple[str, str]] = {}
        self._reported: dict | None = None
        self._report_lock = asyncio.Lock()
        self.task = asyncio.create_task(self.run())

    @property
    def ready(self) -> bool:
        return not self.finished and not self.stopping and all(c.ready for c in self.containers)

    def request_stop(self, grace: float, vanished: bool = False) -> None:
        self.vanished = self.vanished or vanished
        if self.stopping and grace >= self.grace:
            return
        if self.stopping:
            self.kill_now.set()
        self.stopping, self.grace = True, grace
        self.stop_requested.set()

    async def run(self) -> None:
        live = asyncio.create_task(self._live())
        stop = asyncio.create_task(self.stop_requested.wait())
        await asyncio.wait({live, stop}, return_when=asyncio.FIRST_COMPLETED)
        if not live.done():
            await asyncio.gather(*(c.terminate(self.grace) for c in self.containers))
            live.cancel()
        await asyncio.gather(live, return_exceptions=True)
        if not live.cancelled() and live.exception():
            await self._fail(live.exception())
        await stop
        self._teardown()
        if not self.vanished:
            await self.kubelet.api.delete(self.pod, grace_s=0)

    async def _live(self) -> None:
        """Start the pod and run its containers until each is done for good."""
        if self.pod["spec"].get("nodeName") != self.kubelet.node_name:
            await self.kubelet.api.patch(self.pod, {"spec": {"nodeName": self.kubelet.node_name}})
        self.net = self.kubelet.network.add_pod()
        await self.kubelet.update_fences()  # before anything in the pod listens
        self.start_time = _now()
        self.kubelet.update_dns()
        await self.report()
        await self._prepare()
        await asyncio.gather(*(c.run() for c in self.containers))
        self.finished = True
        await self.report()
        self._teardown()
        self.kubelet.update_dns()

    async def _prepare(self) -> None:
        """Images, volumes, env, command lines and mount targets; retried while a ConfigMap,
        Secret or claim is missing, as the kubelet does (CreateContainerConfigError), and with
        back-off while an image is (ErrImagePull, then ImagePullBackOff)."""
        pulls = 0
        while True:
            try:
                vols = await volumes.prepare(self.pod, self.dir, self.kubelet.state_dir / "pvcs", self._get)
                for c in self.containers:
                    await c.prepare(vols)
                self.volumes = vols
                return
            except ConfigError as e:
                for c in self.containers:
                    c.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(e)}}
                await self.report()
                await asyncio.sleep(1)
            except ImageNotPresent as e:
                await self.report()  # the container that tried: ErrImagePull
                delay = min(self.kubelet.backoff_s * 2**pulls, self.kubelet.backoff_cap_s)
                pulls += 1
                await asyncio.sleep(min(delay, 1.0))
                for c in self.containers:
                    if c.state.get("waiting", {}).get("reason") == "ErrImagePull":
                        c.state = {"waiting": {"reason": "ImagePullBackOff",
                                               "message": f'Back-off pulling image "{c.spec.get("image")}": {e}'}}
                await self.report()
                await asyncio.sleep(max(delay - 1.0, 0))

    async def _fail(self, error: BaseException) -> None:
        """A pod the kubelet itself could not run (a launch or network error) ends Failed."""
        log.error("pod %s/%s: %r", self.ns, self.name, error)
        self.finished = True
        for c in self.containers:
            c.terminate_now()
        self._teardown()
        status = {"phase": "Failed", "reason": "KubeletError", "message": repr(error)}
        await self.kubelet.api.patch(self.pod, {"status": status}, status=True)

    async def _get(self, plural: str, ns: str, name: str) -> dict | None:
        return await self.kubelet.api.get(self.kubelet.api.core(plural), ns, name)

    def _teardown(self) -> None:
        if self.net is not None:
            self.kubelet.network.remove_pod(self.net)
            self.net = None

    # --- status --------------------------------------------------------------------------
    def phase(self) -> str:
        if not all(c.started_once for c in self.containers):
            return "Pending"
        if not self.finished:
            return "Running"
        return "Succeeded" if all(c.exit_code == 0 for c in self.containers) else "Failed"

    def _condition(self, kind: str, ok: bool, reason: str | None = None) -> dict:
        status = "True" if ok else "False"
        if self._transitions.get(kind, ("",))[0] != status:
            self._transitions[kind] = (status, _now())
        out = {"type": kind, "status": status, "lastTransitionTime": self._transitions[kind][1]}
        return out | ({"reason": reason} if reason else {})

    def status(self) -> dict:
        phase = self.phase()
        reason = "PodCompleted" if self.finished else None
        ready = self.ready
        ip = self.net.ip if self.net else self.pod.get("status", {}).get("podIP")
        out = {
            "phase": phase,
            "hostIP": self.kubelet.network.host_ip,
            "hostIPs": [{"ip": self.kubelet.network.host_ip}],
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", True, reason),
                self._condition("ContainersReady", ready, reason),
                self._condition("Ready", ready, reason),
            ],
            "containerStatuses": [c.status() for c in self.containers],
        }
        return out | ({"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {})

    async def report(self) -> None:
        async with self._report_lock:
            status = self.status()
            if status != self._reported:
                await self.kubelet.api.patch(self.pod, {"status": status}, status=True)
                self._reported = status


class ContainerRunner:
    """One container: its process, restarts and probes."""

    def __init__(self, pod: PodRunner, spec: dict):
        self.pod = pod
        self.spec = spec
        self.name = spec["name"]
        self.launch_spec: Path | None = None
        self.env: dict[str, str] = {}
        self.identity: dict = {}
        self.image: Image | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.state: dict = {"waiting": {"reason": "ContainerCreating"}}
        self.last_state: dict = {}
        self.restart_count = 0
        self.started_once = False
        self.started = False  # the startup probe passed
        self.ready = False
        self.exit_code: int | None = None

    async def prepare(self, vols: dict[str, Path]) -> None:
        try:
            self.image = image = await self.pod.kubelet.images.get(self.spec.get("image", ""))
        except ImageNotPresent as e:
            self.state = {"waiting": {"reason": "ErrImagePull", "message": str(e)}}
            raise
        # What the downward API reads is what this kubelet decided, whatever the cached object says.
        pod = self.pod.pod | {"status": self.pod.status()}
        pod["spec"] = pod["spec"] | {"nodeName": self.pod.kubelet.node_name}
        env = await container_env(pod, self.spec, self.pod._get)
        argv = command_line(self.spec, env, image.entrypoint, image.cmd)
        self.identity = identity(pod, self.spec, image.user_ids())
        mounts = volumes.mounts(self.spec, vols)
        self.termination_log = self.pod.dir / f"{self.name}.termination-log"
        self.pod.dir.mkdir(parents=True, exist_ok=True)
        self.termination_log.touch()
        self.termination_log.chmod(0o666)  # whatever user the container runs as
        mounts.append({"source": str(self.termination_log), "read_only": False,
                       "target": self.spec.get("terminationMessagePath", TERMINATION_LOG)})
        hostname = pod["spec"].get("hostname") or pod["metadata"]["name"]
        cwd = self.spec.get("workingDir") or image.workdir
        rootfs = None
        if image.rootfs is None:  # the stand-in: the host's files, mount targets made on the host
            if not cwd:
                cwd = str(self.pod.dir / "workdir")
                os.makedirs(cwd, exist_ok=True)
            footprint = self.pod.kubelet.network.footprint
            for target, is_dir in [(m["target"], Path(m["source"]).is_dir()) for m in mounts] + [(cwd, True)]:
                if not volumes.under_another(target, mounts):  # an existing one may be co-owned
                    footprint.create_path(Path(target), is_dir)
        else:  # the image's files: launch.py makes what is missing inside the container's root
            cwd = cwd or "/"
            rootfs = {"lower": image.rootfs, "dir": str(self.pod.dir / f"{self.name}.rootfs")}
            mounts.append({"source": str(self.pod.net.hosts_file), "target": "/etc/hosts", "read_only": True})
        uid = self.identity["uid"]
        home = (image.passwd_entry(uid) or ("", 0, "/root" if uid == 0 else "/"))[2]
        # HOME as a runtime sets it: the user's in the image's passwd, else / (root: /root)
        self.env = {"HOME": home} | image.env | {"HOSTNAME": hostname} | self.pod.kubelet.image_env | env
        self.launch_spec = self.pod.dir / f"{self.name}.json"
        self.launch_spec.write_text(json.dumps(
            {"argv": argv, "env": self.env, "cwd": cwd, "hostname": hostname, "mounts": mounts,
             "image": image.host_paths, "rootfs": rootfs, "identity": self.identity}, indent=1
        ))

    async def run(self) -> None:
        """Run, and restart per restartPolicy, until the container is done for good."""
        policy = self.pod.pod["spec"].get("restartPolicy", "Always")
        crashes = 0
        while True:
            started = asyncio.get_running_loop().time()
            await self._start()
            watching = asyncio.create_task(self._probe())
            code = await self.proc.wait()
            watching.cancel()
            _signal_group(self.proc.pid, signal.SIGKILL)  # what the process left in its group
            self.exit_code = 128 - code if code < 0 else code
            self.ready = self.started = False
            self.state = {"terminated": {
                "exitCode": self.exit_code, "reason": "Completed" if self.exit_code == 0 else "Error",
                "startedAt": self.state.get("running", {}).get("startedAt"), "finishedAt": _now(),
                "containerID": self._container_id(), **self._termination_message(),
            }}
            if self.pod.stopping or policy == "Never" or (policy == "OnFailure" and self.exit_code == 0):
                await self.pod.report()
                return
            if asyncio.get_running_loop().time() - started > BACKOFF_RESET_S:
                crashes = 0
            delay = min(self.pod.kubelet.backoff_s * 2**crashes, self.pod.kubelet.backoff_cap_s)
            crashes += 1
            self.last_state = self.state
            self.state = {"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {delay:g}s restarting failed container={self.name} pod={self.pod.name}",
            }}
            await self.pod.report()
            await asyncio.sleep(delay)
            self.restart_count += 1

    def _termination_message(self) -> dict:
        """What the container left at its terminationMessagePath (4096 bytes at most); after a
        failure with `FallbackToLogsOnError`, if it left nothing, its log's tail (the last 80
        lines, 2048 bytes at most), as the kubelet does."""
        message = self.termination_log.read_bytes()[:4096]
        if not message.strip() and self.exit_code and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = self._log().read_bytes()[-2048:]
            message = b"\n".join(tail.splitlines()[-80:])
        return {"message": message.decode(errors="replace")} if message.strip() else {}

    def _log(self) -> Path:
        """This run's log."""
        meta = self.pod.pod["metadata"]
        return log_path(self.pod.kubelet.state_dir, meta["namespace"], meta["name"], meta["uid"], self.name,
                        self.restart_count)

    async def _start(self) -> None:
        logs = self._log()
        logs.parent.mkdir(parents=True, exist_ok=True)
        self.termination_log.write_bytes(b"")  # each run of the container leaves its own message
        if self.image.rootfs is not None:  # each run starts from the image's files, as a new container
            shutil.rmtree(self.pod.dir / f"{self.name}.rootfs", ignore_errors=True)
        with open(logs, "wb") as out:  # noqa: ASYNC230 (a local file)
            self.proc = await asyncio.create_subprocess_exec(
                "ip", "netns", "exec", self.pod.net.netns, sys.executable, str(LAUNCH), str(self.launch_spec),
                stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        self.started_once = True
        self.exit_code = None
        self.state = {"running": {"startedAt": _now()}}
        if "startupProbe" not in self.spec:
            self.started = True
            self.ready = "readinessProbe" not in self.spec
        await self.pod.report()

    def _container_id(self) -> str:
        return f"localcluster://{self.proc.pid}" if self.proc else ""

    def status(self) -> dict:
        return {
            "name": self.name, "image": self.spec.get("image", ""), "imageID": self.image.id if self.image else "",
            "containerID": self._container_id(), "ready": self.ready, "started": self.started,
            "restartCount": self.restart_count, "state": self.state, "lastState": self.last_state,
        }

    # --- probes --------------------------------------------------------------------------
    async def _probe(self) -> None:
        ip = self.pod.net.ip

        def check(kind: str):
            return probes.make_check(self.spec[kind], self.spec, ip, self._exec_in)

        async def on_startup(ok: bool) -> None:
            if ok:
                self.started = True
                self.ready = "readinessProbe" not in self.spec
                await self.pod.report()
            else:
                await self._kill("startup probe failed")

        async def on_ready(ok: bool) -> None:
            self.ready = ok
            self.pod.kubelet.update_dns()
            await self.pod.report()

        async def on_alive(ok: bool) -> None:
            if not ok:
                await self._kill("liveness probe failed")

        if "startupProbe" in self.spec:
            await probes.watch(self.spec["startupProbe"], check("startupProbe"), on_startup, until_success=True)
        watches = []
        if "readinessProbe" in self.spec:
            watches.append(probes.watch(self.spec["readinessProbe"], check("readinessProbe"), on_ready))
        if "livenessProbe" in self.spec:
            watches.append(probes.watch(self.spec["livenessProbe"], check("livenessProbe"), on_alive, state=True))
        await asyncio.gather(*watches)

    async def _kill(self, why: str) -> None:
        log.info("pod %s/%s container %s: %s, restarting", self.pod.ns, self.pod.name, self.name, why)
        await self.terminate(float(self.pod.pod["spec"].get("terminationGracePeriodSeconds", 30)))

    async def _exec_in(self, argv: list[str], timeout: float) -> int:
        proc = await asyncio.create_subprocess_exec(
            "nsenter", "-t", str(self.proc.pid), "-m", "-n", "-u", "-r", "-w",
            f"--setuid={self.identity['uid']}", f"--setgid={self.identity['gid']}", "--", *argv, env=self.env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
        )
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
            return -1

    def terminate_now(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            _signal_group(self.proc.pid, signal.SIGKILL)

    async def terminate(self, grace: float) -> None:
        """SIGTERM the process group, wait `grace` seconds (or until the pod's kill_now), SIGKILL."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        exited = asyncio.create_task(proc.wait())
        cut = asyncio.create_task(self.pod.kill_now.wait())
        await asyncio.wait({exited, cut}, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        cut.cancel()
        _signal_group(proc.pid, signal.SIGKILL)
        await exited
