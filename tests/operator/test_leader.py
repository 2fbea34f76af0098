"""High availability: two operator replicas against one kmock API server, each with its own
thread and event loop (as separate pods would be), its own credentials (a bearer token that
marks its requests), the real elector (rlkube_operator.leader) and the real kopf operator.
One reconciles; the other only reads the Lease until the first dies or stops, then takes over
the same runs without making a second set of children."""

import asyncio
import functools
import json
import os
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import kopf
import kubernetes_validate
import pytest
from kubernetes import client
from rlkube_operator import leader, podread, progress
from rlkube_operator.kube import Kube
from rlkube_operator.main import build_registry, parse_args
from rlkube_operator.reconcile import Reconciler, Settings

from tests.fixtures import processes
from tests.fixtures.inference import free_port
from tests.operator.cluster import NS, Cluster
from tests.operator.embedded import PERMISSIVE, TOKEN_KEY
from tests.operator.hostile import serve_status_pods
from tests.operator.test_helm import operator_args, render
from tests.operator.test_operator_kmock import rlrun

LEASE = "rlkube-operator"
# Short enough for a test of seconds, long enough that a busy machine does not lose the Lease.
FAST = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.2}
CHILDREN = ("ConfigMap", "Service", "StatefulSet", "Deployment", "Job", "PodDisruptionBudget")
WRITES = {"POST", "PUT", "PATCH", "DELETE"}


def free_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/healthz"


def requests_of(server, token: str) -> list[tuple[int, object]]:
    """(arrival number, request) of every request made with this bearer token."""
    return [(i, r) for i, r in enumerate(list(server))
            if any(k.lower() == "authorization" and v == f"Bearer {token}" for k, v in r.headers.items())]


class Replica:
    """One operator pod: `crash()` kills it without a word (the Lease stays held until it
    expires), `stop()` is SIGTERM (kopf stops, the Lease is released). `workers`: the size of
    its reconcile thread pool (the event loop's default executor; None: Python's default,
    min(32, CPUs + 4))."""

    def __init__(self, name: str, cluster: Cluster, status_url: str, lease: str = LEASE, *,
                 workers: int | None = None, **timing):
        self.name, self.error = name, None
        self._workers = workers
        self.liveness = free_port_url()
        self._url = str(cluster.server.url).rstrip("/")
        self._status_url = status_url
        self._election = leader.Election(lease_name=lease, namespace=NS, identity=name, **timing)
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> "Replica":
        self._thread.start()
        self._started.wait(10)
        return self

    async def crash(self) -> None:
        self._loop.call_soon_threadsafe(self._task.cancel)
        await self._join()

    async def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        await self._join()

    async def _join(self) -> None:
        await asyncio.to_thread(self._thread.join, 30)
        assert not self._thread.is_alive(), f"{self.name} did not stop"

    def _run(self) -> None:
        try:
            asyncio.run(self._lead())
        except asyncio.CancelledError:
            pass  # crashed
        except BaseException as e:  # noqa: BLE001 - the test asserts on it
            self.error = e

    def _api(self) -> client.ApiClient:
        config = client.Configuration(host=self._url)
        config.api_key = {"authorization": f"Bearer {self.name}"}
        return client.ApiClient(config)

    def _login(self, **_) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=self._url, insecure=True, default_namespace=NS, token=self.name)

    async def _lead(self) -> None:
        self._loop, self._task, self._stop = asyncio.get_running_loop(), asyncio.current_task(), asyncio.Event()
        self._started.set()
        if self._workers:
            self._loop.set_default_executor(ThreadPoolExecutor(self._workers, thread_name_prefix=f"{self.name}-pass"))
        api = self._api()
        registry = build_registry(Reconciler(Kube(api), Settings(status_url_template=self._status_url,
                                                                    token_key=TOKEN_KEY, guardrails=PERMISSIVE)),
                                  interval=0.3, login=self._login)
        settings = kopf.OperatorSettings()
        settings.watching.reconnect_backoff = 0.2
        operate = functools.partial(kopf.operator, registry=registry, settings=settings, standalone=True,
                                    namespaces=[NS], liveness_endpoint=self.liveness)
        await leader.lead(leader.LeaseLock(api, self._election), operate, self._stop, standby_liveness=self.liveness)

    def requests(self, server) -> list[tuple[int, object]]:
        return requests_of(server, self.name)

    def writes(self, server) -> list[tuple[int, object]]:
        return [(i, r) for i, r in self.requests(server) if r.method.value in WRITES]

    def lease_specs_written(self, server) -> list[dict]:
        """The Lease specs this replica wrote (its JSON patches' `/spec`), in order."""
        return [op["value"] for _, r in self.writes(server) if r.resource and r.resource.plural == "leases"
                for op in (r.data if isinstance(r.data, list) else []) if op["path"] == "/spec"]


@pytest.fixture
async def replicas(kmock, orchestrator_status):
    """Makes replicas; stops those still running at the end."""
    made = []
    async with Cluster(kmock) as cluster:

        def make(name: str, lease: str = LEASE, **timing) -> Replica:
            replica = Replica(name, cluster, orchestrator_status.url, lease, **(timing or FAST))
            made.append(replica)
            return replica.start()

        make.cluster = cluster
        yield make
        for replica in made:
            if replica._thread.is_alive():
                await replica.stop()


def holder(cluster: Cluster) -> str | None:
    return ((cluster.get("Lease", LEASE) or {}).get("spec") or {}).get("holderIdentity")


def children(cluster: Cluster) -> dict[tuple[str, str], str]:
    return {(kind, name): cluster.get(kind, name)["metadata"]["uid"] for kind in CHILDREN for name in cluster.names(kind)}


async def healthz(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status


async def a_run_led_by_the_first_while_the_second_waits(make):
    """Replica a leads and makes the run's children; b has been asking for the Lease all along
    and has done nothing else. Returns (a, b, the children)."""
    cluster = make.cluster
    a = make("operator-a")
    await cluster.until(lambda: holder(cluster) == "operator-a", what="a holds the lease")
    b = make("operator-b")
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0") and cluster.get("PodDisruptionBudget", "rt-inference"),
                        what="a made the run's children")
    await cluster.until(lambda: len(b.requests(cluster.server)) >= 5, what="b asking for the lease")
    assert await healthz(b.liveness) == 200  # a waiting replica is alive: the kubelet keeps it
    asked = {(r.method.value, r.resource.plural if r.resource else None) for _, r in b.requests(cluster.server)}
    assert asked == {("GET", "leases")}, "the standby replica did more than read the lease"
    return a, b, children(cluster)


async def the_second_takes_over_without_duplicates(cluster: Cluster, a: Replica, b: Replica, before: dict):
    """b holds the Lease and reconciles the run a made: a deleted child comes back, made by b,
    and nothing else is made again; none of a's requests came after b's first write."""
    await cluster.until(lambda: holder(cluster) == "operator-b", what="b takes the lease over")
    await cluster.delete("Service", "rt-inference")
    await cluster.until(lambda: cluster.get("Service", "rt-inference"), what="b reconciles: the Service back")
    await cluster.run_pods(cluster.get("StatefulSet", "rt-inference"), 1)
    await cluster.until(lambda: next(c for c in cluster.status("RLRun", "rt")["conditions"]
                                     if c["type"] == "InferenceReady")["status"] == "True", what="b updates status")
    after = children(cluster)
    assert after.keys() == before.keys(), "a second set of children, or one missing"
    assert {k for k in after if after[k] != before[k]} == {("Service", "rt-inference")}
    server = cluster.server
    assert max(i for i, _ in a.requests(server)) < min(i for i, _ in b.writes(server)), "both wrote at once"
    lease = cluster.get("Lease", LEASE)["spec"]
    assert lease["leaseTransitions"] == 1
    assert await healthz(b.liveness) == 200  # kopf's own endpoint now, on the same port


async def test_the_standby_takes_over_when_the_leader_dies(replicas):
    cluster = replicas.cluster
    a, b, before = await a_run_led_by_the_first_while_the_second_waits(replicas)
    await a.crash()  # the Lease stays held: b waits for it to expire
    await the_second_takes_over_without_duplicates(cluster, a, b, before)
    assert {spec["holderIdentity"] for spec in a.lease_specs_written(cluster.server)} == {"operator-a"}
    await b.stop()
    assert (a.error, b.error) == (None, None)
    assert holder(cluster) is None  # released on the way out


async def test_a_stopping_leader_hands_over_without_waiting_for_the_lease_to_expire(replicas):
    cluster = replicas.cluster
    slow = {"lease_duration": 600.0, "renew_deadline": 400.0, "retry_period": 0.2}  # expiry is out of reach
    a = replicas("operator-a", **slow)
    await cluster.until(lambda: holder(cluster) == "operator-a", what="a holds the lease")
    b = replicas("operator-b", **slow)
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0") and cluster.get("PodDisruptionBudget", "rt-inference"),
                        what="a made the run's children")
    before = children(cluster)
    await a.stop()  # SIGTERM on a rolling update: the pass in flight ends, the Lease is released
    assert "holderIdentity" not in a.lease_specs_written(cluster.server)[-1]
    await the_second_takes_over_without_duplicates(cluster, a, b, before)
    assert (a.error, b.error) == (None, None)


async def test_a_leader_that_sees_another_holder_stops_at_once(replicas):
    """The Lease taken from under it (a partition healed after another replica took over):
    kopf is stopped and the elector raises, which ends the process."""
    cluster = replicas.cluster
    a = replicas("operator-a")
    await cluster.until(lambda: holder(cluster) == "operator-a", what="a holds the lease")
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="a reconciles")
    await cluster.patch("Lease", LEASE, {"spec": {"holderIdentity": "operator-z", "renewTime": "2030-01-01T00:00:00.000000Z"}})
    await asyncio.to_thread(a._thread.join, 30)
    assert isinstance(a.error, leader.LeadershipLost) and "operator-z" in str(a.error)
    assert holder(cluster) == "operator-z"  # not released: it was not a's


@pytest.mark.parametrize(("argv", "message"), [
    (["--renew-deadline", "20"], "renew_deadline (20.0) must be shorter than lease_duration (15.0)"),
    (["--lease-name", "Operator_Lease"], "--lease-name: String should match pattern"),
    (["--lease-namespace", ""], "--leader-elect needs --lease-namespace"),
])
def test_bad_election_flags_are_refused_naming_the_flag(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(SystemExit):
        parse_args(["-n", NS, "--leader-elect", "--lease-namespace", "ops", *argv])
    assert message in capsys.readouterr().err


def test_the_identity_is_the_pod_name(monkeypatch):
    monkeypatch.setenv("POD_NAME", "rlkube-operator-7d9f-x2k4p")
    monkeypatch.setenv("POD_NAMESPACE", "rlkube")
    election = parse_args(["-n", NS, "--leader-elect"]).election
    assert (election.identity, election.namespace, election.lease_name) == (
        "rlkube-operator-7d9f-x2k4p", "rlkube", "rlkube-operator")
    assert parse_args(["-n", NS]).election is None


def deployment(objects: list[dict]) -> dict:
    return next(o for o in objects if o["kind"] == "Deployment")


def test_the_chart_runs_two_replicas_that_elect_one_and_roll(monkeypatch):
    objects = render({"podDisruptionBudget": {"enabled": True}})
    deploy = deployment(objects)
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = deploy["spec"]["template"]["spec"]
    (env,) = [e for e in pod["containers"][0]["env"] if e["name"] == "POD_NAME"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    monkeypatch.setenv("POD_NAME", "rlkube-rlkube-operator-5d8c-abcde")
    election = parse_args(operator_args({})).election
    assert election == leader.Election(lease_name=deploy["metadata"]["name"], namespace="rlkube-system",
                                       identity="rlkube-rlkube-operator-5d8c-abcde")
    (term,) = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deploy["spec"]["selector"]["matchLabels"]
    (pdb,) = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    assert pdb["spec"]["selector"] == deploy["spec"]["selector"] and pdb["spec"]["maxUnavailable"] == 1
    for obj in objects:
        if obj["kind"] in ("Deployment", "PodDisruptionBudget", "Role", "RoleBinding"):
            kubernetes_validate.validate(obj, "1.37.0", strict=True)


def test_without_election_the_chart_runs_one_replica_recreated():
    objects = render({"leaderElection": {"enabled": False}, "replicas": 1})
    assert deployment(objects)["spec"]["strategy"] == {"type": "Recreate"}
    assert parse_args(operator_args({"leaderElection": {"enabled": False}, "replicas": 1})).election is None
    assert not [o for o in objects if o["metadata"]["name"].endswith("-leader-election")]


@pytest.mark.parametrize(("values", "message"), [
    ({"leaderElection": {"enabled": False}}, "replicas > 1 needs leaderElection.enabled"),
    ({"leaderElection": {"renewDeadline": 20}}, "retryPeriod < renewDeadline < leaseDuration"),
    ({"replicas": 0}, "/replicas"),
])
def test_unsafe_ha_values_are_refused(values, message):
    with pytest.raises(Exception) as error:
        render(values)
    assert message in str(error.value)


HTTP_VERBS = {"GET": "get", "POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}


async def test_the_lease_role_grants_exactly_what_the_electors_use(replicas):
    """Every request a leader and a standby make for the Lease (create, renew, read, release,
    take over), against the chart's Lease Role: `get`/`patch` only of the Lease named in the
    operator's arguments."""
    cluster = replicas.cluster
    lease = parse_args(operator_args({})).election.lease_name
    slow = {"lease_duration": 600.0, "renew_deadline": 400.0, "retry_period": 0.2}
    a = replicas("operator-a", lease, **slow)
    await cluster.until(lambda: cluster.get("Lease", lease), what="a created the lease")
    b = replicas("operator-b", lease, **slow)
    await cluster.until(lambda: len(b.requests(cluster.server)) >= 2, what="b asking for the lease")
    await a.stop()
    await cluster.until(lambda: cluster.get("Lease", lease)["spec"].get("holderIdentity") == "operator-b",
                        what="b takes over")
    used = {(HTTP_VERBS[r.method.value], r.name) for replica in (a, b) for _, r in replica.requests(cluster.server)
            if r.resource and r.resource.plural == "leases"}
    (role,) = [o for o in render({}) if o["kind"] == "Role" and o["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "rlkube-system"  # the release's, whatever it watches
    granted = {(verb, name) for rule in role["rules"] if rule["resources"] == ["leases"]
               for verb in rule["verbs"] for name in rule.get("resourceNames", [None])}
    assert used == granted == {("create", None), ("get", lease), ("patch", lease)}


def kubeconfig(path, server, token: str):
    """A kubeconfig whose bearer token marks the process's requests."""
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": token, "user": {"token": token}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": token, "namespace": NS}}],
    }))
    return path


def start_operator(cluster: Cluster, name: str, config_dir: Path, *flags: str, env: dict | None = None,
                   ) -> subprocess.Popen:
    """`rlkube-operator --leader-elect` in a process of its own, as the chart runs it (POD_NAME
    from the downward API), against the emulator with a bearer token `name`; `flags` add to or
    override its arguments, `env` to its environment."""
    config = kubeconfig(config_dir / f"{name}.kubeconfig", str(cluster.server.url).rstrip("/"), name)
    key = config_dir / "token-key"
    key.write_bytes(TOKEN_KEY)
    return processes.spawn(
        [sys.executable, "-m", "rlkube_operator.main", f"--namespace={NS}", f"--operator-namespace={NS}", "--metrics-port=0",
         f"--liveness={free_port_url()}", "--leader-elect", f"--lease-namespace={NS}", f"--lease-name={LEASE}",
         f"--token-key-file={key}", f"--guardrails={PERMISSIVE.model_dump_json()}", *flags],
        env=os.environ | (env or {}) | {"POD_NAME": name, "KUBECONFIG": str(config)})


@pytest.fixture
async def operator_process(replicas, tmp_path):
    """Starts operator processes (`start_operator`) with the `FAST` Lease timing; kills what is
    left at the end."""
    started = []
    timing = [f"--{key.replace('_', '-')}={value}" for key, value in FAST.items()]

    def start(name: str) -> subprocess.Popen:
        started.append(start_operator(replicas.cluster, name, tmp_path, *timing))
        return started[-1]

    yield start
    for process in started:
        await asyncio.to_thread(processes.stop, process, 0)


async def exit_code(process: subprocess.Popen) -> int:
    return await asyncio.to_thread(process.wait, 30)


async def test_sigterm_stops_a_standby_at_once_and_makes_the_leader_hand_over(replicas, operator_process):
    cluster = replicas.cluster
    processes = {name: operator_process(name) for name in ("operator-a", "operator-b")}
    leading = await cluster.until(lambda: holder(cluster), what="one holds the lease")
    (standing_by,) = processes.keys() - {leading}
    await cluster.until(lambda: len(requests_of(cluster.server, standing_by)) >= 2, what="the other asking for it")
    processes[standing_by].send_signal(signal.SIGTERM)
    assert await exit_code(processes[standing_by]) == 0
    assert holder(cluster) == leading
    processes[leading].send_signal(signal.SIGTERM)
    assert await exit_code(processes[leading]) == 0
    assert holder(cluster) is None  # released: a new pod takes it without waiting for it to expire


async def test_a_leader_process_that_loses_the_lease_exits_to_restart(replicas, operator_process):
    cluster = replicas.cluster
    a = operator_process("operator-a")
    await cluster.until(lambda: holder(cluster) == "operator-a", what="a holds the lease")
    await cluster.patch("Lease", LEASE, {"spec": {"holderIdentity": "operator-z"}})
    assert await exit_code(a) == 1


async def renewal_gaps(cluster: Cluster, seconds: float) -> list[float]:
    """Seconds between the Lease's successive renewals seen over `seconds` (sampled every 50 ms)."""
    loop, seen, gaps = asyncio.get_running_loop(), None, []
    end = changed = loop.time()
    end += seconds
    while loop.time() < end:
        renewed = ((cluster.get("Lease", LEASE) or {}).get("spec") or {}).get("renewTime")
        if renewed != seen:
            seen, gaps, changed = renewed, gaps + [loop.time() - changed], loop.time()
        await asyncio.sleep(0.05)
    return gaps[1:] + [loop.time() - changed]


async def test_the_leader_renews_while_every_reconcile_worker_reads_a_trickling_pod(kmock):
    """Two reconcile workers and three runs whose orchestrators trickle their GET /status a
    byte every 0.2 s (no socket read ever waits long): every worker is held by a pod. The Lease
    is renewed on time all along, each read ends at its deadline, and each run says why its
    progress cannot be read."""
    names = [f"trickle-{i}" for i in range(3)]
    async with Cluster(kmock) as cluster, serve_status_pods(trickle_every=0.2) as pods:
        a = Replica("operator-a", cluster, pods.url, workers=2, **FAST).start()
        await cluster.until(lambda: holder(cluster) == "operator-a", what="a holds the lease")
        for name in names:
            await cluster.create(rlrun(name))
        for name in names:
            owner = await cluster.until(lambda n=name: cluster.get("Deployment", f"{n}-orchestrator"), what="orchestrator")
            await cluster.run_pods(owner, 1)
        await cluster.until(lambda: a.error or len(pods.hostile_seconds["trickle"]) >= len(names), what="reads cut")
        gaps = await renewal_gaps(cluster, 2 * FAST["renew_deadline"])
        assert a.error is None and holder(cluster) == "operator-a"
        assert max(gaps) < FAST["renew_deadline"], gaps
        assert max(pods.hostile_seconds["trickle"]) < podread.DEADLINE_S + 2
        for name in names:
            url = progress.status_url(pods.url, service=f"{name}-orchestrator", namespace=NS, port=8080)
            unreadable = await cluster.until(lambda n=name: next(c for c in cluster.status("RLRun", n)["conditions"]
                                                          if c["type"] == "ProgressReadable"), what="condition")
            assert (unreadable["status"], unreadable["reason"]) == ("False", "ReadTimeout")
            assert unreadable["message"] == f"status read from {url} exceeded {podread.DEADLINE_S:g} s"
        await a.stop()
    assert a.error is None
