"""RLPool and its members, black-box: the operator (embedded kopf) against the local cluster's API
server. A pool gets a trainer and an inference fleet; a run naming it (`spec.poolRef`) gets only
its orchestrator (and env workers), and none until the pool admits it, with a condition naming
the field and the limit."""

import base64
import copy

import pytest
from rlkube.config import InferenceConfig, OrchestratorConfig, TrainerConfig
from rlkube.config.pool import PoolSection, PoolTrainerConfig
from rlkube.scopes import MEMBER_SCOPES, member_scoped, scope_env, scoped
from rlkube_operator.admission import Candidate, decide
from rlkube_operator.crd import build_crd
from rlkube_operator.egress import Egress
from rlkube_operator.guardrails import Guardrails
from rlkube_operator.poolspec import RLPoolSpec
from rlkube_operator.runtoken import run_token

from e2e.localcluster.apiserver import now
from tests.operator.cluster import NS, pod_succeeded
from tests.operator.embedded import TOKEN_KEY, running_operator
from tests.operator.test_operator_kmock import condition, rlrun

POOL_MODEL = "/data/reverse-text-sft/weights/final"


def rlpool(name: str = "pool", **spec) -> dict:
    base = rlrun()["spec"]
    pool_spec = {k: copy.deepcopy(base[k]) for k in ("image", "inference", "trainer", "storage", "securityContext")}
    pool_spec["config"] = {"model": {"name": POOL_MODEL}, "trainer": {"device": "cpu"},
                           "inference": {"enforce_eager": True}}
    pool_spec |= {"maxRuns": 2, "maxLoraRank": 16} | spec
    return {"apiVersion": "rlkube.dev/v1alpha1", "kind": "RLPool", "metadata": {"name": name}, "spec": pool_spec}


def member(name: str, rank: int | None = 16, lora: dict | None = None, **spec) -> dict:
    run = rlrun(name, poolRef={"name": "pool"}, envWorkers={"replicas": 1}, **spec)
    if rank is not None:
        run["spec"]["config"]["trainer"]["lora"] = {"rank": rank} | (lora or {})
    return run


def runtime_config(model, text: str, tmp_path):
    """`text` (a TOML the operator wrote) as the runtime's own loader reads it."""
    from rlkube.config import load_config

    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(model, ["@", str(path)])


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def accepted(cluster, name: str) -> dict | None:
    status = cluster.status("RLRun", name)
    return next((c for c in status.get("conditions", []) if c["type"] == "Accepted"), None)


async def test_a_pool_runs_a_pool_trainer_and_lora_inference_and_admits_its_members(cluster, tmp_path):
    pool = await cluster.create(rlpool())
    uid = pool["metadata"]["uid"]
    job = await cluster.until(lambda: cluster.get("Job", "pool-trainer-0"), what="pool trainer Job")
    (trainer,) = job["spec"]["template"]["spec"]["containers"]
    assert trainer["command"][-3:] == ["rlkube.entrypoints.pool_trainer", "@", "/etc/rlkube/pool.toml"]
    token = run_token(TOKEN_KEY, uid)
    assert env_of(trainer)["RLKUBE_TOKEN"] == {"secretKeyRef": {"name": "pool-token", "key": "token"}}
    secret = cluster.get("Secret", "pool-token")["data"]
    assert base64.b64decode(secret["token"]).decode() == token
    assert cluster.names("Deployment") == set()  # a pool has no orchestrator: its members do

    data = cluster.get("ConfigMap", "pool-config")["data"]
    inference = runtime_config(InferenceConfig, data["inference.toml"], tmp_path)
    assert inference.max_lora_rank == 16 and inference.max_loras == 2
    assert not inference.start_paused  # no member may resume the shared server
    assert inference.host == "0.0.0.0" and inference.model.name == POOL_MODEL
    trainer_config = runtime_config(PoolTrainerConfig, data["pool.toml"], tmp_path)  # what pool-trainer reads
    assert (trainer_config.pool.name, trainer_config.pool.max_runs, trainer_config.pool.host) == ("pool", 2, "0.0.0.0")
    assert trainer_config.trainer.lora.rank == 16 and trainer_config.model.name == POOL_MODEL
    assert str(trainer_config.output_dir) == "/data/pool"
    # every inference replica by its pod's stable name: where it unloads a departed member's adapter
    replicas = cluster.get("StatefulSet", "pool-inference")["spec"]["replicas"]
    assert trainer_config.pool.inference_urls == [
        f"http://pool-inference-{i}.pool-inference.{NS}.svc:{inference.port}" for i in range(replicas)]
    ports = {p["name"]: p["port"] for p in cluster.get("Service", "pool-trainer-master")["spec"]["ports"]}
    assert ports["pool"] == trainer_config.pool.port

    # The pool's policies admit its members' pods (any namespace, by the pool's uid) on inference's
    # port and, orchestrators only, on the trainer's gRPC port (Attach).
    policy = cluster.get("NetworkPolicy", "pool-trainer-network-policy")["spec"]["ingress"]
    attach = [r for r in policy if r.get("ports") == [{"protocol": "TCP", "port": trainer_config.pool.port}]]
    assert attach and attach[0]["from"][0]["podSelector"]["matchLabels"] == {"rlkube.dev/pool-uid": uid}


async def test_a_member_gets_its_orchestrator_only_with_credentials_from_the_pool_token(cluster, tmp_path):
    pool = await cluster.create(rlpool())
    token = run_token(TOKEN_KEY, pool["metadata"]["uid"])
    runs = {}
    for name in ("ma", "mb"):
        runs[name] = await cluster.create(member(name))
    for name in runs:
        await cluster.until(lambda name=name: cluster.get("Deployment", f"{name}-orchestrator"), what="orchestrator")
        await cluster.until(lambda name=name: cluster.get("Deployment", f"{name}-env-worker"), what="env worker")
    assert {n for n in cluster.names("Job") if n.startswith("m")} == set()  # no trainer of its own
    assert not {"ma-inference", "mb-inference"} & cluster.names("StatefulSet")
    creds = {}
    for name in runs:
        member_name = f"{NS}.{name}"
        secret = cluster.get("Secret", f"{name}-token")["data"]
        values = {k: base64.b64decode(v).decode() for k, v in secret.items()}
        assert values == {s: member_scoped(token, member_name, s) for s in MEMBER_SCOPES}
        creds[name] = values
        assert scoped(run_token(TOKEN_KEY, runs[name]["metadata"]["uid"]), "generate") not in values.values()
        for component in ("orchestrator", "env-worker"):
            deploy = cluster.get("Deployment", f"{name}-{component}")
            (c,) = deploy["spec"]["template"]["spec"]["containers"]
            env = env_of(c)
            assert env["RLKUBE_POOL_MEMBER"] == member_name
            assert env["RLKUBE_POOL_TRAINER"] == f"pool-trainer-master.{NS}.svc:{PoolSection().port}"
            assert env["RLKUBE_POOL_INFERENCE"] == f"http://pool-inference.{NS}.svc:8000"
            assert env[scope_env("generate")] == {"secretKeyRef": {"name": f"{name}-token", "key": "generate"}}
            assert deploy["spec"]["template"]["metadata"]["labels"]["rlkube.dev/pool-uid"] == pool["metadata"]["uid"]
        orchestrator = runtime_config(OrchestratorConfig, cluster.get("ConfigMap", f"{name}-config")["data"][
            "orchestrator.toml"], tmp_path)
        assert orchestrator.client.lora_adapter == member_name and orchestrator.model.name == POOL_MODEL
        # member mode: it attaches itself, from its own Service, with its own trainer config
        assert orchestrator.pool.member == member_name and orchestrator.pool.trainer == env["RLKUBE_POOL_TRAINER"]
        assert orchestrator.pool.address == f"{name}-orchestrator.{NS}.svc:{orchestrator.rollouts.port}"
        assert str(orchestrator.pool.trainer_config) == "/etc/rlkube/trainer.toml"
        member_trainer = runtime_config(TrainerConfig, cluster.get("ConfigMap", f"{name}-config")["data"][
            "trainer.toml"], tmp_path)
        assert member_trainer.lora.rank == 16 and member_trainer.model.name == POOL_MODEL
        assert member_trainer.max_steps == orchestrator.max_steps and member_trainer.weights.url is None
        assert orchestrator.client.base_urls == [f"http://pool-inference-0.pool-inference.{NS}.svc:8000"]
    assert set(creds["ma"].values()).isdisjoint(creds["mb"].values())

    status = await cluster.until(lambda: cluster.status("RLPool", "pool").get("memberCount") == 2
                                 and cluster.status("RLPool", "pool"), what="two members")
    assert sorted((m["member"], m["share"]) for m in status["members"]) == [(f"{NS}.ma", 0.5), (f"{NS}.mb", 0.5)]


async def test_a_member_whose_orchestrator_finished_succeeds_and_frees_its_place(cluster):
    """No trainer Job of its own says a member finished: its orchestrator's exit 0 with its last
    step as termination message does. The run Succeeds, its pods go as a solo run's, and the
    pool drops it: the run waiting for a place attaches."""
    await cluster.create(rlpool())
    for name in ("ma", "mb"):
        await cluster.create(member(name))
    deployment = await cluster.until(lambda: cluster.get("Deployment", "ma-orchestrator"), what="ma's orchestrator")
    await cluster.until(lambda: cluster.get("Deployment", "mb-orchestrator"), what="mb's orchestrator")
    await cluster.create(member("mc"))
    await cluster.until(lambda: accepted(cluster, "mc") and accepted(cluster, "mc")["reason"] == "PoolFull",
                        what="mc waiting: the pool is full")
    await cluster.run_pods(deployment, 1, **pod_succeeded(finished_step=5))
    status = await cluster.until(lambda: cluster.status("RLRun", "ma").get("phase") == "Succeeded"
                                 and cluster.status("RLRun", "ma"), what="ma Succeeded")
    assert status["step"] == 5 and status["completionTime"]
    assert status["message"] == f"finished at step 5 on RLPool {NS}/pool"
    assert accepted(cluster, "ma")["reason"] == "Finished"
    await cluster.until(lambda: not {"ma-orchestrator", "ma-env-worker"} & cluster.names("Deployment"),
                        what="ma's orchestrator and env workers gone")
    pool = await cluster.until(lambda: f"{NS}.mc" in {m["member"] for m in cluster.status("RLPool", "pool")
                                                       .get("members", [])} and cluster.status("RLPool", "pool"),
                               what="mc attached in ma's place")
    assert sorted(m["member"] for m in pool["members"]) == [f"{NS}.mb", f"{NS}.mc"]
    await cluster.until(lambda: accepted(cluster, "mc")["reason"] == "Attached", what="mc Attached")
    assert cluster.status("RLRun", "ma")["phase"] == "Succeeded", "an ended member is never attached again"


POOLS_NS = "pools"


@pytest.fixture
async def two_namespaces(kmock, orchestrator_status):
    """The operator watching team-a (the runs) and `pools` (the pool), with egress policies."""
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": POOLS_NS, "uid": POOLS_NS, "creationTimestamp": now()}}
    kmock._store(kmock.kinds["", "v1", "namespaces"], namespace, "ADDED")
    async with running_operator(kmock, orchestrator_status.url, namespaces=(NS, POOLS_NS), settings={
            "egress": Egress()}, interval=0.3, progress_interval=0.0) as cluster:
        yield cluster


def read(cluster, kind: str, namespace: str, name: str) -> dict | None:
    return cluster.server.read(cluster.kind(kind), namespace, name)


async def test_a_run_of_a_namespace_not_admitted_waits_then_attaches_once_labelled(two_namespaces):
    cluster = two_namespaces
    selector = {"matchLabels": {"rlkube.example/pool": "yes"}}
    pool = rlpool(allowedRuns={"namespaces": {"from": "Selector", "selector": selector}})
    pool["metadata"]["namespace"] = POOLS_NS
    pool = await cluster.create(pool)
    await cluster.until(lambda: read(cluster, "Job", POOLS_NS, "pool-trainer-0"), what="pool trainer")
    run = member("m")
    run["spec"]["poolRef"]["namespace"] = POOLS_NS
    await cluster.create(run)
    refused = await cluster.until(lambda: (a := accepted(cluster, "m")) and a, what="a decision")
    assert (refused["status"], refused["reason"]) == ("False", "NamespaceNotAllowed")
    assert f"spec.poolRef: namespace {NS} is not admitted by RLPool {POOLS_NS}/pool" in refused["message"]
    assert "rlkube.example/pool" in refused["message"]
    assert cluster.status("RLRun", "m")["phase"] == "Pending"
    assert cluster.names("Deployment") == set() and cluster.names("Secret") == set()

    trainer = read(cluster, "Job", POOLS_NS, "pool-trainer-0")["metadata"]["uid"]
    inference = read(cluster, "StatefulSet", POOLS_NS, "pool-inference")["metadata"]["uid"]
    await cluster._call("PATCH", f"/api/v1/namespaces/{NS}", {"metadata": {"labels": {"rlkube.example/pool": "yes"}}})
    deploy = await cluster.until(lambda: cluster.get("Deployment", "m-orchestrator"), what="attached")
    await cluster.until(lambda: accepted(cluster, "m")["status"] == "True", what="Accepted")
    assert env_of(deploy["spec"]["template"]["spec"]["containers"][0])["RLKUBE_POOL_TRAINER"] == \
        f"pool-trainer-master.{POOLS_NS}.svc:{PoolSection().port}"
    # The member admits the pool's trainer (it pulls the batches), from the pool's namespace.
    ingress = cluster.get("NetworkPolicy", "m-network-policy")["spec"]["ingress"]
    peer = ingress[-1]["from"][0]
    assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": POOLS_NS}}
    assert peer["podSelector"]["matchLabels"] == {"rlkube.dev/run-uid": pool["metadata"]["uid"]}
    # With egress policies, the member reaches the pool's inference and Attach port, the pool's
    # trainer the members' orchestrators.
    egress = cluster.get("NetworkPolicy", "m-egress-network-policy")["spec"]["egress"]
    reached = {(rule["to"][0]["podSelector"]["matchExpressions"][0]["values"][0], rule["ports"][0]["port"])
               for rule in egress if "podSelector" in rule["to"][0] and "matchExpressions" in rule["to"][0]["podSelector"]}
    assert reached == {("inference", 8000), ("trainer", PoolSection().port)}
    pool_egress = read(cluster, "NetworkPolicy", POOLS_NS, "pool-egress-network-policy")["spec"]["egress"]
    assert {"matchLabels": {"rlkube.dev/pool-uid": pool["metadata"]["uid"]}, "matchExpressions": [
        {"key": "app.kubernetes.io/component", "operator": "In", "values": ["orchestrator"]}]} in [
        rule["to"][0].get("podSelector") for rule in pool_egress]
    # Attached without a restart of any pool pod.
    assert read(cluster, "Job", POOLS_NS, "pool-trainer-0")["metadata"]["uid"] == trainer
    assert read(cluster, "StatefulSet", POOLS_NS, "pool-inference")["metadata"]["uid"] == inference
    status = await cluster.until(lambda: (s := read(cluster, "RLPool", POOLS_NS, "pool").get("status") or {})
                                 .get("memberCount") == 1 and s, what="pool member")
    assert status["members"] == [{"member": f"{NS}.m", "namespace": NS, "name": "m", "share": 1.0}]


async def test_refusals_name_the_field_and_the_limit_and_create_no_pods(cluster):
    await cluster.create(rlpool(maxRuns=1, maxLoraRank=8))
    await cluster.create(member("big", rank=32))
    await cluster.create(member("small", rank=4))
    await cluster.create(member("shape", rank=8, lora={"dropout": 0.1}))
    await cluster.create(member("nolora", rank=None))
    other = member("model", rank=8)
    other["spec"]["config"]["model"]["name"] = "other/model"
    await cluster.create(other)
    await cluster.create(member("first", rank=8))
    await cluster.until(lambda: cluster.get("Deployment", "first-orchestrator"), what="first member")
    await cluster.create(member("second", rank=8))
    refusals = {}
    for name in ("big", "small", "shape", "nolora", "model", "second"):
        refusals[name] = await cluster.until(lambda name=name: (a := accepted(cluster, name)) and a["status"] == "False"
                                             and a, what=f"{name} refused")
    assert refusals["big"]["reason"] == "LoraRankTooLarge"
    assert "spec.config.trainer.lora.rank 32" in refusals["big"]["message"]
    assert "spec.maxLoraRank 8" in refusals["big"]["message"]
    assert refusals["small"]["reason"] == "LoraRankMismatch" and "rank 4 is below" in refusals["small"]["message"]
    assert refusals["shape"]["reason"] == "LoraShapeMismatch"
    assert "spec.config.trainer.lora.dropout 0.1" in refusals["shape"]["message"]
    assert refusals["nolora"]["reason"] == "LoraRequired"
    assert refusals["model"]["reason"] == "BaseModelMismatch" and "spec.config.model.name" in refusals["model"]["message"]
    assert refusals["second"]["reason"] == "PoolFull" and "spec.maxRuns 1" in refusals["second"]["message"]
    for name in ("big", "small", "shape", "nolora", "model", "second"):
        assert cluster.status("RLRun", name)["phase"] == "Pending"
        assert not {f"{name}-orchestrator", f"{name}-env-worker"} & cluster.names("Deployment")
    status = await cluster.until(lambda: cluster.status("RLPool", "pool").get("waiting") and
                                 cluster.status("RLPool", "pool"), what="pool status")
    assert status["memberCount"] == 1 and [m["name"] for m in status["members"]] == ["first"]

    # The member leaves: the waiting run takes its place, the pool's pods untouched.
    trainer_uid = cluster.get("Job", "pool-trainer-0")["metadata"]["uid"]
    inference_uid = cluster.get("StatefulSet", "pool-inference")["metadata"]["uid"]
    await cluster.delete("RLRun", "first")
    await cluster.until(lambda: cluster.get("Deployment", "second-orchestrator"), what="second attaches")
    await cluster.until(lambda: accepted(cluster, "second")["status"] == "True", what="Accepted")
    assert cluster.get("Job", "pool-trainer-0")["metadata"]["uid"] == trainer_uid
    assert cluster.get("StatefulSet", "pool-inference")["metadata"]["uid"] == inference_uid


def test_admission_names_the_namespace_rule_and_the_quota():
    spec = RLPoolSpec.model_validate(rlpool(
        allowedRuns={"namespaces": {"from": "Selector", "selector": {"matchLabels": {"team": "rl"}}}},
        quotas=[{"namespace": "team-b", "maxRuns": 1, "weight": 3}], maxRuns=4)["spec"])

    def run(ns, name, created, attached=False):
        return Candidate(ns, name, f"{ns}/{name}", created, attached, None, {"rank": 16})

    runs = [run("team-b", "b1", "1"), run("team-b", "b2", "2"), run("team-c", "c1", "3"), run("pools", "p1", "4")]
    labels = {"team-b": {"team": "rl"}, "team-c": {}}
    out = decide("pool", "pools", spec, runs, labels)
    assert out["team-b/b1"].accepted and out["pools/p1"].accepted  # the pool's own namespace, always
    assert out["team-b/b2"].reason == "NamespaceQuotaReached"
    assert "spec.quotas[namespace=team-b].maxRuns 1" in out["team-b/b2"].message
    assert out["team-c/c1"].reason == "NamespaceNotAllowed"
    assert "spec.poolRef: namespace team-c" in out["team-c/c1"].message and "team" in out["team-c/c1"].message
    # Fair shares: team-b weighs 3, the pool's namespace 1.
    assert (out["team-b/b1"].share, out["pools/p1"].share) == (0.75, 0.25)
    # The namespace is labelled: its run attaches; an attached member keeps its place before an older run.
    labels["team-c"] = {"team": "rl"}
    spec = spec.model_copy(update={"max_runs": 2})
    runs = [run("team-b", "b1", "1"), run("team-c", "c1", "3"), run("pools", "p1", "4", attached=True)]
    out = decide("pool", "pools", spec, runs, labels)
    assert out["pools/p1"].accepted and out["team-b/b1"].accepted and out["team-c/c1"].reason == "PoolFull"
    out = decide("pool", "pools", spec.model_copy(update={"max_runs": 3}), runs, labels)
    assert out["team-c/c1"].accepted


def test_rlpool_printer_columns():
    (version,) = build_crd("RLPool")["spec"]["versions"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase", "Ready": ".status.ready",
        "Members": ".status.memberCount", "MaxRuns": ".spec.maxRuns", "Waiting": ".status.waiting",
        "Inference": ".status.inference.ready", "Restarts": ".status.restarts", "Message": ".status.message",
        "Age": ".metadata.creationTimestamp"}
    assert build_crd("RLPool")["spec"]["names"]["shortNames"] == ["rlp"]



async def test_kueue_suspend_and_deletion_apply_to_pools_and_members(cluster):
    await cluster.create(rlpool(queue={"name": "pools"}))
    wl = await cluster.until(lambda: cluster.get("Workload", "pool-workload"), what="the pool's Workload")
    assert {s["name"]: s["count"] for s in wl["spec"]["podSets"]} == {"inference": 1, "trainer": 1}
    trainer = next(s for s in wl["spec"]["podSets"] if s["name"] == "trainer")["template"]["spec"]["containers"][0]
    assert "rlkube.entrypoints.pool_trainer" in trainer["command"]
    # Not admitted: the pool is queued at zero, its members may still attach and wait for it.
    job = await cluster.until(lambda: cluster.get("Job", "pool-trainer-0"), what="pool trainer")
    assert job["spec"]["suspend"] is True and cluster.get("StatefulSet", "pool-inference")["spec"]["replicas"] == 0
    await cluster.until(lambda: cluster.status("RLPool", "pool").get("phase") == "Pending", what="queued")

    await cluster.create(member("m", queue={"name": "members"}))
    wl = await cluster.until(lambda: cluster.get("Workload", "m-workload"), what="the member's Workload")
    assert {s["name"]: s["count"] for s in wl["spec"]["podSets"]} == {"orchestrator": 1, "env-worker": 1}

    await cluster.create(member("s", suspend=True))
    workers = await cluster.until(lambda: cluster.get("Deployment", "s-env-worker"), what="suspended member")
    assert workers["spec"]["replicas"] == 0 and cluster.get("Deployment", "s-orchestrator")["spec"]["replicas"] == 0
    await cluster.until(lambda: cluster.status("RLRun", "s").get("phase") == "Suspended", what="Suspended")
    await cluster.patch("RLRun", "s", {"spec": {"suspend": False}})
    await cluster.until(lambda: cluster.get("Deployment", "s-orchestrator")["spec"]["replicas"] == 1, what="resumed")

    # The pool goes: its members lose their pods and wait, saying why.
    await cluster.delete("RLPool", "pool")
    await cluster.until(lambda: accepted(cluster, "s")["reason"] == "PoolNotFound", what="member waits")
    assert cluster.status("RLRun", "s")["phase"] == "Pending"
    assert not {"s-orchestrator", "s-env-worker"} & cluster.names("Deployment")


@pytest.mark.parametrize("operator_settings", [{"guardrails": Guardrails(allowed_image_registries=["*"], allowed_claims=["*"])}])
async def test_the_guardrails_check_a_pools_spec(cluster):
    root = rlpool(securityContext={"runAsNonRoot": False, "runAsUser": 0})
    await cluster.create(root)
    status = await cluster.until(lambda: cluster.status("RLPool", "pool").get("phase") and
                                 cluster.status("RLPool", "pool"), what="refused")
    assert status["phase"] == "Failed"
    assert condition(status, "SpecAccepted")["message"].startswith(
        "forbidden by the guardrails: spec.securityContext.runAsNonRoot: false")
    assert not cluster.names("Job") and not cluster.names("StatefulSet")
