"""Pod networking for the local cluster: one Linux bridge, one network namespace per pod, and
per-pod hosts files standing in for cluster DNS.

What is emulated: every pod has its own IP on a private /24 (`10.251.X.0/24`, X chosen so that
no existing route overlaps), reachable from the host (the bridge holds `.1`) and from every other
pod. Names resolve through `/etc/netns/<netns>/hosts`, which `ip netns exec` bind-mounts onto
`/etc/hosts` for the pod's processes:

- a Service `<svc>` in namespace `<ns>`: `<svc>` (same namespace only), `<svc>.<ns>`,
  `<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`. Headless Services (clusterIP None) map to
  every backing pod's IP (one line each, ordered by pod name; glibc's hosts lookup returns the
  first), ClusterIP Services to ONE ready backing pod (the oldest). `publishNotReadyAddresses`
  includes pods that are not ready, terminating pods too until their processes have exited (as
  the EndpointSlice controller keeps them for such Services during their grace period);
- a pod with `hostname` + `subdomain`, when a headless Service named like the subdomain selects
  it (as CoreDNS requires): `<hostname>.<subdomain>[.<ns>[.svc[.cluster.local]]]`;
- the pod's own hostname, and `localhost`.

What is not: there is no kube-proxy and no virtual Service IP, so a ClusterIP Service's `port`
must equal its `targetPort` (the name resolves to a pod, and the client dials `port` on it).
Pods have no default route: nothing outside the bridge is reachable from a pod.

Everything created is written down first in an ownership record under `/run/rlkube-localcluster`
(with the creating pid), removed at `close()`, and removed by the next run if the owner died.
Nothing without a record is ever touched.
"""

import ipaddress
import json
import logging
import os
import random
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RECORDS = Path("/run/rlkube-localcluster")
NETNS_ETC = Path("/etc/netns")
CLUSTER_DOMAIN = "cluster.local"


class NetworkUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no CAP_NET_ADMIN, no `ip`)."""


def unavailable_reason() -> str | None:
    """Why pod networking cannot work on this machine, or None when it can (tests skip on it)."""
    if os.geteuid() != 0:
        return "the local cluster needs root (network namespaces, bind mounts)"
    for tool in ("ip", "nsenter", "nft"):  # nft: NetworkPolicy (netpolicy.py), `make cluster-tools`
        if shutil.which(tool) is None:
            return f"the local cluster needs `{tool}` on PATH"
    probe = f"rlk-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], check=False, capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], check=False, capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], check=False, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Footprint:
    """The ownership record of one run: its id, its pid, and the host paths it created (mount
    targets such as `/data`). Written before anything is created, so a crash leaves a record
    that the next run can act on."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.file = RECORDS / f"{run_id}.json"
        self.paths: list[str] = []
        self._save()

    def _save(self) -> None:
        RECORDS.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps({"pid": os.getpid(), "paths": self.paths}))

    def create_path(self, path: Path, is_dir: bool) -> None:
        """Create `path` (and missing parents) on the host, recording each level created. A path
        that another run recorded, live or dead, is co-owned, so whichever ends last removes it:
        a dead run's leftover `/data` that this run mounts on must not be removed by the next
        run's `remove_stale_runs` (on the host it is an empty directory; removing it detaches
        the pods' mounts on it, which then saw a read-only `/data` mid-run). The kubelet calls
        it for every mount target of a pod, existing or not."""
        if os.path.lexists(path):
            if str(path) in _recorded_paths() and str(path) not in self.paths:
                self.paths.append(str(path))
                self._save()
            return
        missing = [level for level in (path, *path.parents) if not level.exists()]
        self.paths.extend(str(level) for level in reversed(missing))
        self._save()
        if is_dir:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch(exist_ok=True)

    def remove(self) -> None:
        _remove_run(self.run_id, self.paths)


def _live_paths() -> set[str]:
    return _recorded_paths(live_only=True)


def _recorded_paths(live_only: bool = False) -> set[str]:
    """The paths other runs' records name (only those of live runs with `live_only`)."""
    paths: set[str] = set()
    for record in RECORDS.glob("*.json"):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if data["pid"] != os.getpid() and (_pid_alive(data["pid"]) or not live_only):
            paths.update(data["paths"])
    return paths


def _remove_run(run_id: str, paths: list[str]) -> None:
    """Remove everything named after `run_id`: processes left in its namespaces, the namespaces
    (their veth pairs go with them), the bridge, hosts dirs, created paths (only while empty and
    not used by another live run), and the record itself."""
    prefix = f"rlk-{run_id}-"
    for name in _ip("netns", "list", check=False).stdout.split():
        if name.startswith(prefix):
            _kill_netns_processes(name)
            _ip("netns", "del", name, check=False)
            shutil.rmtree(NETNS_ETC / name, ignore_errors=True)
    for hosts_dir in NETNS_ETC.glob(f"{prefix}*") if NETNS_ETC.exists() else []:
        shutil.rmtree(hosts_dir, ignore_errors=True)
    if Path(f"/sys/class/net/rlk{run_id}").exists():
        _ip("link", "del", f"rlk{run_id}", check=False)
    live = _live_paths()
    for path in sorted(paths, key=lambda p: -p.count("/")):
        if path in live:
            continue
        p = Path(path)
        try:
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            elif p.is_file() and p.stat().st_size == 0:
                p.unlink()
        except OSError as e:  # not empty (someone wrote there) or a mountpoint elsewhere
            log.warning("left %s in place: %s", p, e)
    (RECORDS / f"{run_id}.json").unlink(missing_ok=True)


def _kill_netns_processes(netns: str) -> None:
    for pid in _ip("netns", "pids", netns, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove_stale_runs() -> None:
    """Remove what runs whose process died left behind (their record names the pid)."""
    for record in RECORDS.glob("*.json") if RECORDS.exists() else []:
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if not _pid_alive(data["pid"]):
            log.info("removing leftovers of dead run %s (pid %s)", record.stem, data["pid"])
            _remove_run(record.stem, data["paths"])


def _free_subnet() -> ipaddress.IPv4Network:
    taken = []
    route_types = {"local", "broadcast", "unicast", "unreachable", "blackhole", "prohibit", "throw",
                   "multicast", "anycast"}
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        tokens = line.split()
        if tokens and tokens[0] in route_types:
            tokens = tokens[1:]
        if tokens and tokens[0] != "default":
            taken.append(ipaddress.ip_network(tokens[0], strict=False))
    start = random.randrange(256)
    for i in range(256):
        candidate = ipaddress.ip_network(f"10.251.{(start + i) % 256}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return candidate
    raise NetworkUnavailable("no free /24 in 10.251.0.0/16 (every one overlaps a route)")


@dataclass
class PodNet:
    """A pod's network: its namespace (`ip netns exec <netns>`), IP and hosts file."""

    netns: str
    ip: str
    veth: str

    @property
    def hosts_file(self) -> Path:
        return NETNS_ETC / self.netns / "hosts"


class Network:
    """The bridge and the pods' namespaces of one local cluster."""

    def __init__(self):
        reason = unavailable_reason()
        if reason:
            raise NetworkUnavailable(reason)
        remove_stale_runs()
        self.footprint = Footprint(f"{os.getpid() % 0x10000:04x}{random.randrange(0x1000):03x}")
        self.footprint.create_path(NETNS_ETC, is_dir=True)
        self.bridge = f"rlk{self.footprint.run_id}"
        self.subnet = _free_subnet()
        hosts = self.subnet.hosts()
        self.host_ip = str(next(hosts))
        self._free = [str(ip) for ip in hosts]
        self._serial = 0
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_ip}/{self.subnet.prefixlen}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        log.info("bridge %s on %s", self.bridge, self.subnet)

    def add_pod(self) -> PodNet:
        if not self._free:
            raise RuntimeError(f"no free pod IP left in {self.subnet}")
        self._serial += 1
        run_id = self.footprint.run_id
        pod = PodNet(netns=f"rlk-{run_id}-{self._serial}", ip=self._free.pop(0),
                     veth=f"rlk{run_id}v{self._serial:x}")
        _ip("netns", "add", pod.netns)
        pod.hosts_file.parent.mkdir()
        write_in_place(pod.hosts_file, "127.0.0.1\tlocalhost\n")
        _ip("link", "add", pod.veth, "type", "veth", "peer", "name", "eth0", "netns", pod.netns)
        _ip("link", "set", pod.veth, "master", self.bridge, "up")
        _ip("-n", pod.netns, "addr", "add", f"{pod.ip}/{self.subnet.prefixlen}", "dev", "eth0")
        _ip("-n", pod.netns, "link", "set", "eth0", "up")
        _ip("-n", pod.netns, "link", "set", "lo", "up")
        return pod

    def remove_pod(self, pod: PodNet) -> None:
        """Kill what still runs in the namespace, then delete it (the veth pair goes with it)."""
        _kill_netns_processes(pod.netns)
        _ip("netns", "del", pod.netns, check=False)
        shutil.rmtree(pod.hosts_file.parent, ignore_errors=True)
        self._free.append(pod.ip)

    def close(self) -> None:
        self.footprint.remove()


def write_in_place(path: Path, text: str) -> None:
    """Rewrite a file keeping its inode: `ip netns exec` bind-mounted it onto the processes'
    /etc/hosts, and a renamed replacement would stay invisible to them."""
    with open(path, "a+") as f:
        f.seek(0)
        if f.read() == text:
            return
        f.seek(0)
        f.truncate()
        f.write(text)


# --- cluster DNS as hosts files ---------------------------------------------------------------

@dataclass
class Endpoint:
    """What DNS needs to know of a pod: its object, IP and readiness."""

    pod: dict
    ip: str
    ready: bool


def _selects(service: dict, pod: dict) -> bool:
    selector = service.get("spec", {}).get("selector") or {}
    labels = pod["metadata"].get("labels") or {}
    same_ns = service["metadata"].get("namespace") == pod["metadata"].get("namespace")
    return bool(selector) and same_ns and all(labels.get(k) == v for k, v in selector.items())


def _names(name: str, ns: str, own_ns: str) -> list[str]:
    """A Service-like name as a pod in `own_ns` can spell it (search domains)."""
    fqdn = [f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.{CLUSTER_DOMAIN}"]
    return ([name] if ns == own_ns else []) + fqdn


def hosts_file(own: Endpoint, endpoints: list[Endpoint], services: list[dict]) -> str:
    """The /etc/hosts one pod sees (see the module docstring for the names)."""
    own_ns = own.pod["metadata"]["namespace"]
    spec = own.pod.get("spec", {})
    hostname = spec.get("hostname") or own.pod["metadata"]["name"]
    own_names = [hostname]
    if spec.get("subdomain"):
        own_names.insert(0, f"{hostname}.{spec['subdomain']}.{own_ns}.svc.{CLUSTER_DOMAIN}")
    lines = ["127.0.0.1\tlocalhost", f"{own.ip}\t{' '.join(own_names)}"]
    endpoints = sorted(endpoints, key=lambda e: e.pod["metadata"]["name"])
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        not_ready_too = svc.get("spec", {}).get("publishNotReadyAddresses", False)
        backing = [e for e in endpoints if _selects(svc, e.pod) and (e.ready or not_ready_too)]
        if not backing:
            continue
        headless = svc.get("spec", {}).get("clusterIP") == "None"
        if not headless:
            backing = [min(backing, key=lambda e: (e.pod["metadata"].get("creationTimestamp", ""),
                                                   e.pod["metadata"]["name"]))]
        for e in backing:
            lines.append(f"{e.ip}\t{' '.join(_names(name, ns, own_ns))}")
        if headless:
            for e in backing:
                pod_spec = e.pod.get("spec", {})
                if pod_spec.get("subdomain") == name and pod_spec.get("hostname"):
                    hostname = f"{pod_spec['hostname']}.{name}"
                    lines.append(f"{e.ip}\t{' '.join(_names(hostname, ns, own_ns))}")
    return "\n".join(lines) + "\n"
