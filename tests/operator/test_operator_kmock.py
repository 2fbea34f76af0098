"""Black-box: the operator runs (embedded kopf) against kmock's API emulator; tests apply runs,
play the controllers and kubelets, and read back children, status and events."""

import asyncio
import base64
import copy
import tomllib
from pathlib import Path

import aiohttp
import pytest
import yaml
from rlkube.scopes import HELD, SCOPES, scope_env, scoped
from rlkube_operator.crd import PRINTER_COLUMNS
from rlkube_operator.kube import Kube, api_client
from rlkube_operator.names import TRAINER_METRICS_PORT
from rlkube_operator.reconcile import (
    DEFAULT_OPERATOR_NAMESPACE,
    Reconciler,
    Settings,
    operator_peer,
)
from rlkube_operator.runtoken import run_token

from tests.operator.cluster import (
    NS,
    pod_creating,
    pod_disrupted,
    pod_failed,
    pod_running,
    pod_succeeded,
    pod_unschedulable,
    pod_waiting,
)
from tests.operator.embedded import PERMISSIVE, TOKEN_KEY, operator_requests, running_operator

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"


def example(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d["kind"] in ("RLRun", "SFTRun")]
    return copy.deepcopy(docs[0])


RL_MAX_STEPS = example("rlrun.yaml")["spec"]["config"]["max_steps"]


def rlrun(name: str = "rt", **spec) -> dict:
    run = example("rlrun.yaml")
    run["metadata"]["name"] = name
    run["spec"].update(spec)
    return run


def printer_row(obj: dict) -> dict:
    """What `kubectl get` shows: the CRD's printer columns evaluated on the object."""
    row = {}
    for column in PRINTER_COLUMNS:
        value = obj
        for part in column["jsonPath"].strip(".").split("."):
            value = value.get(part) if isinstance(value, dict) else None
        row[column["name"]] = value
    return row


def condition(status: dict, type_: str) -> dict:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


async def test_rlrun_creates_every_child_with_the_right_spec(cluster):
    run = await cluster.create(rlrun(inference={"replicas": 2}))
    uid = run["metadata"]["uid"]
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")

    assert cluster.names("ConfigMap") == {"rt-config"}
    assert cluster.names("Service") == {"rt-inference", "rt-orchestrator", "rt-trainer-master"}
    assert cluster.names("StatefulSet") == {"rt-inference"}
    assert cluster.names("Deployment") == {"rt-orchestrator"}  # no env workers unless asked for
    assert cluster.names("PersistentVolumeClaim") == set()  # the example brings its own claim
    for kind in ("ConfigMap", "Service", "StatefulSet", "Deployment", "Job"):
        for name in cluster.names(kind):
            (owner,) = cluster.get(kind, name)["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("RLRun", "rt", uid, True)

    sts = cluster.get("StatefulSet", "rt-inference")
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == "rt-inference"
    (inference,) = sts["spec"]["template"]["spec"]["containers"]
    assert inference["command"] == ["rlkube", "inference", "@", "/etc/rlkube/inference.toml"]
    assert inference["readinessProbe"]["httpGet"]["path"] == "/health"
    assert cluster.get("Service", "rt-inference")["spec"]["clusterIP"] == "None"

    deploy = cluster.get("Deployment", "rt-orchestrator")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"] == {"type": "Recreate"}
    ports = {p["name"]: p["port"] for p in cluster.get("Service", "rt-orchestrator")["spec"]["ports"]}
    assert ports == {"grpc": 50051, "http": 8080}

    job = cluster.get("Job", "rt-trainer-0")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["backoffLimit"] == 0
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    command = pod["containers"][0]["command"]
    assert command[:3] == ["rlkube", "torchrun", "--nnodes=1"]
    assert "--master-addr=rt-trainer-master.team-a.svc" in command
    assert command[-3:] == ["rlkube.entrypoints.trainer", "@", "/etc/rlkube/trainer.toml"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "reverse-text-shared"

    data = cluster.get("ConfigMap", "rt-config")["data"]
    orchestrator = tomllib.loads(data["orchestrator.toml"])
    assert orchestrator["client"]["base_urls"] == [
        f"http://rt-inference-{i}.rt-inference.{NS}.svc:8000" for i in range(2)
    ]
    assert orchestrator["rollouts"]["host"] == "0.0.0.0" and orchestrator["env_workers"] == 0
    trainer = tomllib.loads(data["trainer.toml"])
    assert trainer["rollouts"]["host"] == f"rt-orchestrator.{NS}.svc"
    assert trainer["output_dir"] == "/data/rt" and trainer["ckpt"]["resume_step"] == "latest"
    assert tomllib.loads(data["inference.toml"])["host"] == "0.0.0.0"


async def test_status_and_printer_columns_follow_the_pods(cluster, orchestrator_status):
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    assert status["phase"] == "Initializing"
    assert condition(status, "InferenceReady")["reason"] == "NoPods"

    # Inference cannot be scheduled: Pending, with the scheduler's message.
    await cluster.run_pods(cluster.get("StatefulSet", "rt-inference"), 1,
                           **pod_unschedulable("0/3 nodes are available: 3 Insufficient memory."))
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Pending"
                                 and cluster.status("RLRun", "rt"))
    assert condition(status, "InferenceReady")["reason"] == "Unschedulable"
    assert "Insufficient memory" in status["message"]
    assert condition(status, "Ready")["status"] == "False"

    # It schedules but crash-loops: a condition says so, with the restarts.
    await cluster.patch("Pod", "rt-inference-0", {"status": pod_waiting("CrashLoopBackOff", "back-off 40s", 3)})
    status = await cluster.until(
        lambda: condition(cluster.status("RLRun", "rt"), "InferenceReady")["reason"] == "CrashLoopBackOff"
        and cluster.status("RLRun", "rt"))
    assert condition(status, "Ready")["reason"] == "CrashLoopBackOff"
    assert status["phase"] == "Initializing"

    # Inference recovers, the orchestrator's image cannot be pulled: Pending again, saying why.
    await cluster.patch("Pod", "rt-inference-0", {"status": pod_running()})
    await cluster.run_pods(cluster.get("Deployment", "rt-orchestrator"), 1,
                           **pod_waiting("ImagePullBackOff", 'Back-off pulling image "rlkube:typo"'))
    status = await cluster.until(
        lambda: condition(cluster.status("RLRun", "rt"), "OrchestratorReady")["reason"] == "ImagePullBackOff"
        and cluster.status("RLRun", "rt"))
    assert status["phase"] == "Pending" and "rlkube:typo" in status["message"]
    assert condition(status, "Reconciling")["status"] == "True"  # kstatus: InProgress, not Current
    assert condition(status, "InferenceReady")["status"] == "True"

    # Everything comes up; step and rewards come from the orchestrator's /status, kept to 4
    # significant digits.
    orchestrator_status.body |= {"phase": "running", "step": 7, "reward": 0.7159132524809819,
                                 "eval_reward": 0.81236, "last_checkpoint_step": 5}
    await cluster.patch("Pod", "rt-orchestrator-0", {"status": pod_running()})
    await cluster.run_pods(cluster.get("Job", "rt-trainer-0"), 1)
    # (Both: a pass woken by the orchestrator pod alone may read the step before the trainer runs.)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("step") == 7
                                 and cluster.status("RLRun", "rt")["phase"] == "Running"
                                 and cluster.status("RLRun", "rt"))
    assert (status["reward"], status["evalReward"], status["lastCheckpointStep"], status["maxSteps"]) == (
        0.7159, 0.8124, 5, RL_MAX_STEPS)
    row = printer_row(cluster.get("RLRun", "rt"))
    assert {k: row[k] for k in ("Phase", "Step", "Max", "Reward", "Eval", "Restarts")} == {
        "Phase": "Running", "Step": 7, "Max": RL_MAX_STEPS, "Reward": 0.7159, "Eval": 0.8124, "Restarts": 0}
    for type_ in ("Ready", "Progressing", "InferenceReady", "OrchestratorReady", "TrainerReady", "SpecAccepted"):
        assert condition(status, type_)["status"] == "True", type_
        assert condition(status, type_)["observedGeneration"] == 1
    assert condition(status, "Reconciling")["status"] == "False"
    assert status["observedGeneration"] == 1
    # kopf posts events in the background: wait for them.
    await cluster.until(lambda: {"Initializing", "Pending", "Running"} <= {
        e["reason"] for e in cluster.events() if e.get("involvedObject", {}).get("name") == "rt"}, what="events")
    assert not [e for e in cluster.events() if "succeeded" in e["message"]], "kopf log lines spam events"

    # The trainer Job completes: Succeeded, inference and orchestrator torn down, storage kept.
    # Step and reward stay what the run last reported (the trainer stopped before max_steps).
    orchestrator_status.body |= {"phase": "finished", "step": 9, "reward": 0.5}
    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Succeeded"
                                 and cluster.status("RLRun", "rt"))
    await cluster.until(lambda: not cluster.names("StatefulSet") and not cluster.names("Deployment"),
                        what="teardown")
    assert (status["step"], status["reward"]) == (9, 0.5) and status["completionTime"] and RL_MAX_STEPS > 9
    assert printer_row(cluster.get("RLRun", "rt"))["Reward"] == 0.5
    assert cluster.names("ConfigMap") == {"rt-config"}
    assert condition(status, "Ready")["status"] == "True"

    # A finished run stays finished when its Job goes (ttlSecondsAfterFinished, or by hand).
    await cluster.delete("Job", "rt-trainer-0")
    await asyncio.sleep(2)  # several reconciles (the test operator's timer runs every 0.3 s)
    assert cluster.names("Job") == set() and cluster.names("StatefulSet") == set()
    assert cluster.status("RLRun", "rt")["phase"] == "Succeeded"


@pytest.mark.parametrize("message", [False, True], ids=["no-termination-message", "trainer-says-its-step"])
async def test_a_run_that_ends_while_its_progress_is_unreadable_says_so(cluster, orchestrator_status, message):
    """The final read of a finished run fails (its orchestrator already gone, the operator
    restarting meanwhile): the step is the one the trainer left in its termination message
    (`rlkube.config.cli.write_finished_step`), else the last read, like the reward, and the run
    says which are the last read and why, instead of showing a stale STEP as final."""
    orchestrator_status.body |= {"phase": "running", "step": 7, "reward": 0.42}
    await cluster.create(rlrun())
    await start_everything(cluster)
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("step") == 7, what="step 7")

    orchestrator_status.body |= {"step": 9}
    orchestrator_status.code = 503
    if message:
        await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_succeeded(finished_step=9)})
    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Succeeded"
                                 and cluster.status("RLRun", "rt"), what="Succeeded")
    assert (status["step"], status["reward"]) == (9 if message else 7, 0.42)
    unreadable = condition(status, "ProgressReadable")
    assert unreadable["status"] == "False" and unreadable["message"].startswith(
        "the run ended before its final orchestrator status was read (status from "), unreadable
    last = "the step is the trainer's own, reward and checkpoint the last read" if message else \
        "step and reward are the last read"
    assert unreadable["message"].endswith(last), unreadable


async def test_inference_pods_have_a_disruption_budget_of_their_run(cluster):
    """A drain evicts one inference pod of a run at a time; the budget selects only this run's
    pods (not another run's, nor a recreated predecessor's) and goes with the GPUs at the end."""
    uid = (await cluster.create(rlrun(inference={"replicas": 2})))["metadata"]["uid"]
    await cluster.create(rlrun("other"))
    pdb = await cluster.until(lambda: cluster.get("PodDisruptionBudget", "rt-inference"), what="budget")
    assert pdb["metadata"]["ownerReferences"][0]["uid"] == uid
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    await cluster.run_pods(cluster.get("StatefulSet", "rt-inference"), 2)
    await start_everything(cluster, "other")
    await cluster.run_pods(cluster.get("Deployment", "rt-orchestrator"), 1)
    await cluster.run_pods(cluster.get("Job", "rt-trainer-0"), 1)
    selector = pdb["spec"]["selector"]["matchLabels"]
    pods = {name for name in cluster.names("Pod")
            if selector.items() <= cluster.get("Pod", name)["metadata"]["labels"].items()}
    assert pods == {"rt-inference-0", "rt-inference-1"}  # not its other pods, nor run "other"'s
    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: cluster.get("PodDisruptionBudget", "rt-inference") is None, what="budget gone")
    assert cluster.get("PodDisruptionBudget", "other-inference") is not None


SCRAPER_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


@pytest.mark.parametrize("operator_settings", [{"metrics_scraper_peer": SCRAPER_PEER}])
async def test_by_default_a_run_admits_only_its_own_pods_the_operator_and_the_scrapers_namespace(cluster):
    """Each run's NetworkPolicies select its pods, made before any of them: the trainer's admit
    its own pods (torchrun's store from the trainer's only, the NCCL store's from the trainer's
    and inference's), the operator on the port it reads /status from, and the scraper's
    namespace on the ports that serve /metrics (test_manifests checks who gets through)."""
    from tests.operator.embedded import VERBS, operator_calls

    uid = (await cluster.create(rlrun()))["metadata"]["uid"]
    sft = example("sftrun.yaml")
    sft["metadata"]["name"] = "rt"
    await cluster.create(sft)
    policy = await cluster.until(lambda: cluster.get("NetworkPolicy", "rt-network-policy"), what="policy")
    trainer = await cluster.until(lambda: cluster.get("NetworkPolicy", "rt-trainer-network-policy"), what="policy")
    assert policy["metadata"]["ownerReferences"][0]["uid"] == uid
    run_pods = {"matchLabels": {"rlkube.dev/run-uid": uid}}
    component = {"key": "app.kubernetes.io/component", "values": ["trainer"]}
    assert policy["spec"] == {"podSelector": run_pods | {"matchExpressions": [component | {"operator": "NotIn"}]},
                              "policyTypes": ["Ingress"], "ingress": [
        {"from": [{"podSelector": run_pods}], "ports": [{"protocol": "TCP", "port": p} for p in (8000, 8080, 50051)]},
        {"from": [operator_peer(DEFAULT_OPERATOR_NAMESPACE)], "ports": [{"protocol": "TCP", "port": 8080}]},
        {"from": [SCRAPER_PEER], "ports": [{"protocol": "TCP", "port": p} for p in (8000, 8080, TRAINER_METRICS_PORT)]}]}
    assert trainer["spec"]["podSelector"] == run_pods | {"matchExpressions": [component | {"operator": "In"}]}
    assert trainer["spec"]["ingress"][1]["ports"][-2:] == [{"protocol": "TCP", "port": 1, "endPort": 29499},
                                                          {"protocol": "TCP", "port": 29501, "endPort": 65535}]
    await start_everything(cluster)
    selected = {n for n in cluster.names("Pod") if cluster.get("Pod", n)["metadata"]["labels"].items()
                >= run_pods["matchLabels"].items()}
    assert selected == {"rt-inference-0", "rt-orchestrator-0", "rt-trainer-0-0"}
    sft_policy = await cluster.until(lambda: cluster.get("NetworkPolicy", "rt-sft-trainer-network-policy"))
    assert sft_policy["spec"]["ingress"][-2]["ports"] == [{"protocol": "TCP", "port": 8080}]  # trainer pod 0's
    assert cluster.get("NetworkPolicy", "rt-sft-network-policy") is None  # an SFTRun has no other pods
    created = [resource for request, resource in operator_calls(cluster.server) if VERBS[request.action.value] == "create"]
    assert created.index("networkpolicies") < min(created.index(r) for r in ("statefulsets", "deployments", "jobs"))


@pytest.mark.parametrize("operator_settings", [{"network_policy_peer": None}])
async def test_with_network_policies_off_no_network_policy_is_made(cluster):
    await cluster.create(rlrun())
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    assert cluster.names("NetworkPolicy") == set()


NEW_KEY = b"the operator's new key after a rotation, in tests"


async def test_a_runs_token_is_made_once_owned_by_it_and_reaches_every_pod(cluster, kmock, orchestrator_status):
    """The Secret `<run>-token` is created before the pods, owned by the run, immutable, and
    every container reads the token from it; neither later passes nor a restarted operator
    make a new one (running pods would be locked out of each other). Its token is derived from
    the run's uid and the operator's key, so no operator ever reads a Secret: not to make it,
    not to find it there already."""
    uid = (await cluster.create(rlrun()))["metadata"]["uid"]
    secret = await cluster.until(lambda: cluster.get("Secret", "rt-token"), what="token Secret")
    assert [(r["uid"], r["controller"]) for r in secret["metadata"]["ownerReferences"]] == [(uid, True)]
    assert secret["immutable"] is True
    token = run_token(TOKEN_KEY, uid)
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        s: scoped(token, s) for s in (*SCOPES, "checkpoint")}  # the trainer's checkpoint key too
    await start_everything(cluster)
    for pod in cluster.names("Pod"):
        component = cluster.get("Pod", pod)["metadata"]["labels"]["app.kubernetes.io/component"]
        for c in cluster.get("Pod", pod)["spec"]["containers"]:
            got = [e for e in c["env"] if e["name"].startswith("RLKUBE_TOKEN")]
            assert got == [{"name": scope_env(s), "valueFrom": {"secretKeyRef": {"name": "rt-token", "key": s}}}
                           for s in HELD[component]], f"{pod}/{c['name']}: {got}"

    # A restarted operator is a new Reconciler, remembering nothing: its pass remakes a lost
    # child, and leaves the token as it is.
    await cluster.stop_operator()
    kube = Kube(api_client(str(kmock.url).rstrip("/")))
    await asyncio.to_thread(kube.delete, "Service", NS, "rt-inference")
    restarted = Reconciler(kube, Settings(status_url_template=orchestrator_status.url, token_key=TOKEN_KEY))
    result = await asyncio.to_thread(restarted.reconcile, "RLRun", cluster.get("RLRun", "rt"), "2026-01-01T00:00:00Z")
    assert result.error is None and cluster.get("Service", "rt-inference") is not None, "no pass of the new operator"
    kept = cluster.get("Secret", "rt-token")
    assert (kept["metadata"]["uid"], kept["data"]) == (secret["metadata"]["uid"], secret["data"]), "the token was rotated"
    # A Secret lost meanwhile is made again (by the next operator) with the same token: the pods
    # started before and those started after still agree.
    await asyncio.to_thread(kube.delete, "Secret", NS, "rt-token")
    again = Reconciler(kube, Settings(status_url_template=orchestrator_status.url, token_key=TOKEN_KEY))
    result = await asyncio.to_thread(again.reconcile, "RLRun", cluster.get("RLRun", "rt"), "2026-01-01T00:00:01Z")
    assert result.error is None and cluster.get("Secret", "rt-token")["data"] == secret["data"]
    # Rotation (docs/security.md): an operator restarted under a new key leaves the Secret
    # (running pods keep their token); deleted, it comes back with the new key's token when the
    # pods are next started (here: by the next operator).
    def under_new_key():
        return Reconciler(kube, Settings(status_url_template=orchestrator_status.url, token_key=NEW_KEY,
                                         guardrails=PERMISSIVE))
    result = await asyncio.to_thread(under_new_key().reconcile, "RLRun", cluster.get("RLRun", "rt"), "2026-01-01T00:00:02Z")
    assert result.error is None and cluster.get("Secret", "rt-token")["data"] == secret["data"]
    await asyncio.to_thread(kube.delete, "Secret", NS, "rt-token")
    result = await asyncio.to_thread(under_new_key().reconcile, "RLRun", cluster.get("RLRun", "rt"), "2026-01-01T00:00:03Z")
    assert result.error is None
    assert {k: base64.b64decode(v).decode() for k, v in cluster.get("Secret", "rt-token")["data"].items()} == {
        s: scoped(run_token(NEW_KEY, uid), s) for s in (*SCOPES, "checkpoint")}
    requests = operator_requests(kmock)
    # get: each restarted operator reads the Secret it finds, for its keys; delete: the test's
    assert {verb for verb, path in requests if path == "secrets"} == {"create", "get", "delete"}, requests
    assert requests["create", "secrets"] >= 5  # one by each operator, whether the Secret was there or not


def secret_values(secret: dict) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


async def plant_old_token_secret(cluster, name: str, data: dict[str, str] | None = None) -> dict:
    """Replace run `name`'s token Secret with one an older operator made: `data` (default: the
    single `token` of the operator before scoped credentials), owned by the run. Returns it."""
    old = cluster.get("Secret", f"{name}-token")
    await cluster.delete("Secret", f"{name}-token")
    uid = cluster.get("RLRun", name)["metadata"]["uid"]
    data = data if data is not None else {"token": run_token(TOKEN_KEY, uid)}
    return await cluster.create({"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "immutable": True,
                                 "metadata": {"name": f"{name}-token", "ownerReferences": old["metadata"]["ownerReferences"]},
                                 "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}})


def secret_refs(template: dict) -> set[tuple[str, str]]:
    """(Secret, key) of every required secretKeyRef of a pod template's containers."""
    return {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for c in template["spec"].get("initContainers", []) + template["spec"]["containers"]
            for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})
            and not e["valueFrom"]["secretKeyRef"].get("optional")}


async def test_a_token_secret_from_an_older_operator_is_replaced_with_the_keys_its_new_pods_read(
        cluster, kmock, orchestrator_status):
    """Upgrade: a run made by an older operator keeps its `<run>-token`, and the new operator's
    pods name keys it lacks (every scope, where the Secret holds the single token from before
    scoped credentials; `work`, added since). The new operator, finding it there, replaces it:
    the keys it had keep their values (a key rotated meanwhile changes nothing under running
    pods), the missing ones are added, and no `token` or checkpoint key (the run's checkpoints
    so far are unsigned) appears; every pod the operator then starts finds each key it names.
    One that lacks nothing is left as it is."""
    run = await cluster.create(rlrun(envWorkers={"replicas": 1}))
    uid = run["metadata"]["uid"]
    await start_everything(cluster)
    await cluster.stop_operator()
    kube = Kube(api_client(str(kmock.url).rstrip("/")))

    def upgraded_operator(key=TOKEN_KEY):
        return Reconciler(kube, Settings(status_url_template=orchestrator_status.url, token_key=key,
                                         guardrails=PERMISSIVE))

    def pass_of(reconciler, when: str):
        return asyncio.to_thread(reconciler.reconcile, "RLRun", cluster.get("RLRun", "rt"), when)

    token = run_token(TOKEN_KEY, uid)
    await plant_old_token_secret(cluster, "rt")  # the operator before scoped credentials
    assert (await pass_of(upgraded_operator(), "2026-01-01T00:00:00Z")).error is None
    replaced = cluster.get("Secret", "rt-token")
    assert secret_values(replaced) == {s: scoped(token, s) for s in SCOPES}, "not every scope, or a token left"
    assert replaced["immutable"] is True and run_owned(replaced, uid)
    templates = [cluster.get(kind, n)["spec"]["template"] for kind in ("Deployment", "StatefulSet", "Job")
                 for n in cluster.names(kind)]
    assert {"rt-orchestrator", "rt-env-worker"} <= cluster.names("Deployment")
    for template in templates:
        assert {key for secret, key in secret_refs(template) if secret == "rt-token"} <= set(replaced["data"])

    # A Secret of the scoped operator before `work`, under a key rotated since: kept, `work` added.
    previous = {s: scoped(token, s) for s in SCOPES if s != "work"} | {"checkpoint": scoped(token, "checkpoint")}
    await plant_old_token_secret(cluster, "rt", previous)
    assert (await pass_of(upgraded_operator(NEW_KEY), "2026-01-01T00:00:01Z")).error is None
    assert secret_values(cluster.get("Secret", "rt-token")) == previous | {"work": scoped(run_token(NEW_KEY, uid), "work")}
    # Nothing missing: the Secret is left (same object), whatever the key.
    kept = cluster.get("Secret", "rt-token")
    assert (await pass_of(upgraded_operator(), "2026-01-01T00:00:02Z")).error is None
    assert cluster.get("Secret", "rt-token")["metadata"]["uid"] == kept["metadata"]["uid"]


def run_owned(obj: dict, uid: str) -> bool:
    return [(r["uid"], r.get("controller")) for r in obj["metadata"]["ownerReferences"]] == [(uid, True)]


async def start_everything(cluster, name: str = "rt", attempt: int = 0) -> None:
    job = await cluster.until(lambda: cluster.get("Job", f"{name}-trainer-{attempt}"), what="trainer Job")
    await cluster.run_pods(cluster.get("StatefulSet", f"{name}-inference"), 1)
    await cluster.run_pods(cluster.get("Deployment", f"{name}-orchestrator"), 1)
    await cluster.run_pods(job, 1)
    await cluster.until(lambda: cluster.status("RLRun", name).get("phase") == "Running", what="Running")


async def test_failed_trainer_pod_gang_restarts_from_the_latest_checkpoint(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)
    orchestrator_attempt = cluster.get("Deployment", "rt-orchestrator")["spec"]["template"]["metadata"]

    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_failed(exit_code=137, reason="OOMKilled")})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="restarted trainer Job")
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0") is None, what="failed Job deleted")
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("restarts") == 1
                                 and cluster.status("RLRun", "rt"))
    assert status["attempt"] == 1 and status["phase"] != "Failed"

    # The new attempt resumes from the latest checkpoint, at the same torchrun master Service.
    trainer = tomllib.loads(cluster.get("ConfigMap", "rt-config")["data"]["trainer.toml"])
    assert trainer["ckpt"]["resume_step"] == "latest"
    assert "--master-addr=rt-trainer-master.team-a.svc" in job["spec"]["template"]["spec"]["containers"][0]["command"]
    # The orchestrator restarts with it (its batch state belongs to the old trainer).
    deploy = cluster.get("Deployment", "rt-orchestrator")
    assert deploy["spec"]["template"]["metadata"]["annotations"]["rlkube.dev/attempt"] == "1"
    assert orchestrator_attempt["annotations"]["rlkube.dev/attempt"] == "0"
    warnings = await cluster.until(lambda: [e for e in cluster.events() if e["reason"] == "TrainerRestarted"])
    assert "OOMKilled, exit code 137" in warnings[0]["message"]

    # The new gang runs: Running again, with the restart counted.
    await cluster.run_pods(job, 1)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Running"
                                 and cluster.status("RLRun", "rt"))
    assert status["restarts"] == 1


async def test_backoff_limit_exhausted_fails_the_run_with_the_reason(cluster):
    await cluster.create(rlrun(restartPolicy={"backoffLimit": 1}))
    await start_everything(cluster)
    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_failed()})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="restart")
    await cluster.run_pods(job, 1, **pod_failed(exit_code=3))

    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"))
    assert status["message"].startswith("BackoffLimitExceeded: pod rt-trainer-1-0 failed (Error, exit code 3)")
    assert status["restarts"] == 1 and status["completionTime"]
    assert condition(status, "Ready")["status"] == "False"
    assert condition(status, "Stalled")["status"] == "True"
    assert cluster.get("Job", "rt-trainer-2") is None  # no third attempt
    await cluster.until(lambda: not cluster.names("StatefulSet") and not cluster.names("Deployment"),
                        what="GPUs freed")
    await cluster.until(lambda: any(e["reason"] == "Failed" and e["type"] == "Warning" for e in cluster.events()))

    # Raising the limit (a live field) restarts the failed run from its latest checkpoint.
    await cluster.patch("RLRun", "rt", {"spec": {"restartPolicy": {"backoffLimit": 2}}})
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-2"), what="restart after raising the limit")
    await cluster.until(lambda: cluster.names("StatefulSet") == {"rt-inference"}, what="inference back")
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] != "Failed"
                                 and cluster.status("RLRun", "rt"))
    assert status["restarts"] == 2 and "completionTime" not in status


MISSING_MODEL = ("rlkube trainer: error: invalid config:\n  model.name: '/data/nope' does not exist (a local model "
                 "directory; write one with `rlkube model init --out DIR`, or name a Hugging Face hub id)")


def pod_exited_2(message: str = MISSING_MODEL) -> dict:
    """Failed with exit code 2 (`rlkube.config.cli.EXIT_INVALID`), its error as termination message."""
    status = pod_failed(exit_code=2)
    status["containerStatuses"][0]["state"]["terminated"]["message"] = message
    return status


async def test_a_trainer_exiting_2_fails_the_run_at_once_with_its_message(cluster):
    """Exit code 2 (a missing model) is no crash to retry: Failed at once, restarts unspent,
    the runtime's error in the `Failed` condition and the Warning event."""
    await cluster.create(rlrun(restartPolicy={"backoffLimit": 3}))
    await start_everything(cluster)
    rules = cluster.get("Job", "rt-trainer-0")["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "FailJob",
                        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2]}}
    assert cluster.get("Job", "rt-trainer-0")["spec"]["template"]["spec"]["containers"][0][
        "terminationMessagePolicy"] == "FallbackToLogsOnError"

    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_exited_2()})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"), what="Failed")
    failed = condition(status, "Failed")
    assert (failed["status"], failed["reason"]) == ("True", "InvalidConfig")
    assert "pod rt-trainer-0-0 exited with code 2" in failed["message"]
    assert "model.name: '/data/nope' does not exist" in failed["message"]
    assert status["restarts"] == 0 and status["attempt"] == 0 and status["completionTime"]
    event = await cluster.until(lambda: next((e for e in cluster.events() if e["reason"] == "Failed"), None))
    assert event["type"] == "Warning" and "model.name: '/data/nope' does not exist" in event["message"]
    await asyncio.sleep(1)  # several reconciles: still no second attempt
    assert cluster.get("Job", "rt-trainer-1") is None and cluster.status("RLRun", "rt")["phase"] == "Failed"
    assert not [e for e in cluster.events() if e["reason"] == "TrainerRestarted"]


async def test_an_orchestrator_exiting_2_fails_the_run_while_a_killed_one_does_not(cluster):
    """A Deployment restarts its pod whatever it exited with; the operator reads the exit code."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    killed = pod_waiting("CrashLoopBackOff", "back-off 10s restarting failed container", restarts=1)
    killed["containerStatuses"][0]["lastState"] = pod_failed(exit_code=137)["containerStatuses"][0]["state"]
    await cluster.patch("Pod", "rt-orchestrator-0", {"status": killed})
    await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "OrchestratorReady")["reason"]
                        == "CrashLoopBackOff", what="crash loop seen")
    assert cluster.status("RLRun", "rt")["phase"] == "Running"

    invalid = pod_waiting("CrashLoopBackOff", "back-off 20s restarting failed container", restarts=2)
    invalid["containerStatuses"][0]["lastState"] = pod_exited_2(
        "rlkube orchestrator: error: invalid config:\n  env.0.id: environment 'nope' does not resolve"
    )["containerStatuses"][0]["state"]
    await cluster.patch("Pod", "rt-orchestrator-0", {"status": invalid})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"), what="Failed")
    assert status["message"] == ("InvalidConfig: pod rt-orchestrator-0 exited with code 2: rlkube orchestrator: "
                                 "error: invalid config:; env.0.id: environment 'nope' does not resolve")
    assert status["restarts"] == 0


async def test_a_disrupted_trainer_restarts_without_spending_the_backoff_limit(cluster):
    """With backoffLimit 0, a preempted trainer pod still restarts the gang (not counted), and
    the ordinary failure after it fails the run."""
    await cluster.create(rlrun(restartPolicy={"backoffLimit": 0}))
    await start_everything(cluster)
    job = cluster.get("Job", "rt-trainer-0")
    assert job["spec"]["podFailurePolicy"]["rules"][1] == {
        "action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}

    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_disrupted()})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="restart after the preemption")
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("attempt") == 1
                                 and cluster.status("RLRun", "rt"))
    assert status["restarts"] == 0 and status["phase"] != "Failed"
    event = await cluster.until(lambda: next(e for e in cluster.events() if e["reason"] == "TrainerDisrupted"))
    assert "PreemptionByScheduler" in event["message"] and "not counted against backoffLimit" in event["message"]

    await cluster.run_pods(job, 1, **pod_failed(exit_code=1))
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"))
    assert status["message"].startswith("BackoffLimitExceeded: pod rt-trainer-1-0 failed (Error, exit code 1)")
    assert cluster.get("Job", "rt-trainer-2") is None


async def test_a_run_past_its_deadline_fails_with_deadline_exceeded_and_stops(cluster):
    """activeDeadlineSeconds bounds the whole run: its trainer Job gets the time left (so
    Kubernetes stops it), and at the deadline the run is Failed and its GPUs freed; the trainer
    pods the Job's deadline kills then are not a failure to restart from."""
    await cluster.create(rlrun(activeDeadlineSeconds=3, restartPolicy={"backoffLimit": 5}))
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    assert 1 <= job["spec"]["activeDeadlineSeconds"] <= 3
    await cluster.run_pods(cluster.get("StatefulSet", "rt-inference"), 1)
    await cluster.run_pods(cluster.get("Deployment", "rt-orchestrator"), 1)
    await cluster.run_pods(job, 1)

    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Failed"
                                 and cluster.status("RLRun", "rt"), what="Failed at the deadline")
    assert status["message"].startswith("DeadlineExceeded: the run passed spec.activeDeadlineSeconds (3 s")
    assert condition(status, "Stalled")["status"] == "True" and status["completionTime"]
    await cluster.until(lambda: not cluster.names("StatefulSet") and not cluster.names("Deployment"),
                        what="GPUs freed")
    (event,) = await cluster.until(lambda: [e for e in cluster.events() if e["reason"] == "Failed"], what="event")
    assert event["type"] == "Warning" and "DeadlineExceeded" in event["message"]

    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_failed(exit_code=143)})  # the Job's deadline
    await asyncio.sleep(1)
    status = cluster.status("RLRun", "rt")
    assert status["phase"] == "Failed" and status["message"].startswith("DeadlineExceeded")
    assert status["restarts"] == 0 and cluster.get("Job", "rt-trainer-1") is None


async def test_a_run_created_suspended_starts_its_deadline_when_released(cluster):
    """A run waiting suspended (in a queue) does not spend its activeDeadlineSeconds."""
    await cluster.create(rlrun(activeDeadlineSeconds=2, suspend=True))
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") == "Suspended", what="Suspended")
    await asyncio.sleep(2.5)
    status = cluster.status("RLRun", "rt")
    assert status["phase"] == "Suspended" and not status.get("startTime")

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="released trainer")
    assert job["spec"]["activeDeadlineSeconds"] == 2
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("startTime"), what="the clock started")


async def test_a_finished_run_is_deleted_ttl_seconds_after_it_finished(cluster):
    """ttlSecondsAfterFinished deletes the run object itself (its children go with it by their
    ownerReferences); it applies live, also to a run that has already finished."""
    await cluster.create(rlrun(ttlSecondsAfterFinished=1))
    await cluster.create(rlrun("kept"))
    await start_everything(cluster)
    await start_everything(cluster, "kept")
    await asyncio.sleep(1.5)
    assert cluster.get("RLRun", "rt") is not None  # running: the TTL counts from the finish

    for name in ("rt", "kept"):
        await cluster.patch("Job", f"{name}-trainer-0",
                            {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: cluster.status("RLRun", "kept").get("phase") == "Succeeded", what="Succeeded")
    await cluster.until(lambda: cluster.get("RLRun", "rt") is None, what="the run deleted after its TTL")
    (event,) = await cluster.until(lambda: [e for e in cluster.events() if e["reason"] == "Expired"], what="event")
    assert "ttlSecondsAfterFinished is 1" in event["message"]
    await asyncio.sleep(1.5)
    assert cluster.get("RLRun", "kept") is not None  # no TTL: kept

    await cluster.patch("RLRun", "kept", {"spec": {"ttlSecondsAfterFinished": 0}})
    await cluster.until(lambda: cluster.get("RLRun", "kept") is None, what="deleted once given a TTL")


async def test_suspend_scales_to_zero_and_resume_continues_from_the_checkpoint(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Suspended"
                                 and cluster.status("RLRun", "rt"))
    assert cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 0
    assert cluster.get("Deployment", "rt-orchestrator")["spec"]["replicas"] == 0
    assert cluster.get("Job", "rt-trainer-0")["spec"]["suspend"] is True
    assert cluster.names("ConfigMap") == {"rt-config"}  # storage and config kept
    assert condition(status, "SpecAccepted")["status"] == "True"  # suspend applies live
    assert status["observedGeneration"] == 2

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="resumed trainer")
    assert job["spec"]["suspend"] is False
    assert cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 1
    assert cluster.get("Deployment", "rt-orchestrator")["spec"]["replicas"] == 1
    trainer = tomllib.loads(cluster.get("ConfigMap", "rt-config")["data"]["trainer.toml"])
    assert trainer["ckpt"]["resume_step"] == "latest"
    status = cluster.status("RLRun", "rt")
    assert status["restarts"] == 0  # a resume is not a failure


async def test_env_workers_run_beside_the_orchestrator_suspend_with_it_and_go_on_completion(cluster):
    """`envWorkers.replicas: 2`: a Deployment of 2 `rlkube env-worker` pods owned by the run,
    dialing the orchestrator Service, scaled to zero and back with the run, deleted when it
    finishes (with inference and the orchestrator); the orchestrator's config waits for them."""
    uid = (await cluster.create(rlrun(envWorkers={"replicas": 2})))["metadata"]["uid"]
    workers = await cluster.until(lambda: cluster.get("Deployment", "rt-env-worker"), what="env workers")
    assert cluster.names("Deployment") == {"rt-orchestrator", "rt-env-worker"}
    (owner,) = workers["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("RLRun", "rt", uid, True)
    assert workers["spec"]["replicas"] == 2
    template = workers["spec"]["template"]
    assert template["metadata"]["labels"]["rlkube.dev/run-uid"] == uid
    assert template["metadata"]["labels"]["app.kubernetes.io/component"] == "env-worker"
    (main,) = template["spec"]["containers"]
    assert main["command"] == ["rlkube", "env-worker", "@", "/etc/rlkube/orchestrator.toml",
                               "--rollouts.host", f"rt-orchestrator.{NS}.svc"]
    assert "nvidia.com/gpu" not in str(main["resources"]) and "readinessProbe" not in main
    orchestrator = tomllib.loads(cluster.get("ConfigMap", "rt-config")["data"]["orchestrator.toml"])
    assert orchestrator["env_workers"] == 2

    # Their pods count for no component's health: the run runs with them.
    await start_everything(cluster)
    await cluster.run_pods(workers, 2)
    await asyncio.sleep(0.5)
    assert cluster.status("RLRun", "rt")["phase"] == "Running"

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    await cluster.until(lambda: cluster.get("Deployment", "rt-env-worker")["spec"]["replicas"] == 0,
                        what="env workers scaled to zero")
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    await cluster.until(lambda: cluster.get("Deployment", "rt-env-worker")["spec"]["replicas"] == 2,
                        what="env workers back")
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="resumed trainer")

    await cluster.patch("Job", job["metadata"]["name"],
                        {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Succeeded", what="Succeeded")
    await cluster.until(lambda: not cluster.names("Deployment") and not cluster.names("StatefulSet"),
                        what="env workers, orchestrator and inference deleted")


@pytest.mark.usefixtures("crd_rules_off")
async def test_invalid_spec_is_refused_with_the_field_and_an_event(cluster):
    bad = rlrun()
    bad["spec"]["config"]["orchestrator"]["batch_size"] = 30  # not a multiple of group_size 8
    await cluster.create(bad)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    assert status["phase"] == "Failed"
    accepted = condition(status, "SpecAccepted")
    assert accepted["reason"] == "InvalidSpec"
    assert "config.orchestrator" in accepted["message"] and "multiple of group_size" in accepted["message"]
    assert not cluster.names("Job") and not cluster.names("ConfigMap")
    event = await cluster.until(lambda: next(e for e in cluster.events() if e["reason"] == "Failed"))
    assert event["type"] == "Warning" and "multiple of group_size" in event["message"]

    # Fixing the spec is picked up (level-triggered), and the run starts.
    await cluster.patch("RLRun", "rt", {"spec": {"config": {"orchestrator": {"batch_size": 32}}}})
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer after fix")


@pytest.mark.usefixtures("crd_rules_off")  # the fix below changes fields fixed at creation
async def test_a_run_the_guardrails_forbid_fails_naming_the_field(cluster):
    """This API server has no admission policy (a cluster < 1.30, or `guardrails.enabled=false`):
    the operator applies the guardrails itself, root included, before it creates anything."""
    bad = rlrun()
    bad["spec"]["securityContext"] = {"runAsNonRoot": False, "runAsUser": 0}
    bad["spec"]["trainer"]["pod"] = {"volumes": [{"name": "sa", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token"}}]}}]}
    await cluster.create(bad)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    accepted = condition(status, "SpecAccepted")
    assert (status["phase"], accepted["reason"]) == ("Failed", "InvalidSpec")
    assert accepted["message"].startswith("forbidden by the guardrails: spec.securityContext.runAsNonRoot: false")
    assert "spec.trainer.pod.volumes: a projected serviceAccountToken" in accepted["message"]
    assert not cluster.names("Job") and not cluster.names("ConfigMap")
    event = await cluster.until(lambda: next(e for e in cluster.events() if e["reason"] == "Failed"))
    assert event["type"] == "Warning" and "guardrails.allowRoot" in event["message"]

    await cluster.patch("RLRun", "rt", {"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                                                 "trainer": {"pod": {"volumes": []}}}})
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer after the fix")


@pytest.mark.usefixtures("crd_rules_off")
async def test_changes_that_cannot_apply_live_are_refused_with_a_condition(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)
    await cluster.patch("RLRun", "rt", {"spec": {"config": {"max_steps": 99}, "trainer": {"nodes": 4}}})
    status = await cluster.until(
        lambda: condition(cluster.status("RLRun", "rt"), "SpecAccepted")["status"] == "False"
        and cluster.status("RLRun", "rt"))
    message = condition(status, "SpecAccepted")["message"]
    assert condition(status, "SpecAccepted")["reason"] == "ChangeRequiresRecreate"
    assert "spec.config.max_steps" in message and "spec.trainer.nodes" in message
    assert status["phase"] == "Running" and status["maxSteps"] == RL_MAX_STEPS  # still the applied spec
    assert cluster.get("Job", "rt-trainer-0")["spec"]["parallelism"] == 1
    await cluster.until(lambda: [e for e in cluster.events() if e["reason"] == "ChangeRequiresRecreate"],
                        what="a Warning event for the refused change")
    await asyncio.sleep(1)  # more reconciles: still one event, not one per reconcile
    refused = [e for e in cluster.events() if e["reason"] == "ChangeRequiresRecreate"]
    assert len(refused) == 1 and refused[0]["type"] == "Warning" and "spec.trainer.nodes" in refused[0]["message"]

    # An invalid update of a started run is refused too; the run keeps its applied spec.
    await cluster.patch("RLRun", "rt", {"spec": {"config": {"orchestrator": {"batch_size": 30}}}})
    status = await cluster.until(
        lambda: condition(cluster.status("RLRun", "rt"), "SpecAccepted")["reason"] == "InvalidSpec"
        and cluster.status("RLRun", "rt"))
    assert "multiple of group_size" in condition(status, "SpecAccepted")["message"]
    assert status["phase"] == "Running" and cluster.names("StatefulSet") == {"rt-inference"}


async def test_sftrun_runs_the_trainer_alone_and_succeeds(cluster, orchestrator_status):
    run = example("sftrun.yaml")
    run["metadata"]["name"] = "sft"
    max_steps = run["spec"]["config"]["max_steps"]
    await cluster.create(run)
    job = await cluster.until(lambda: cluster.get("Job", "sft-sft-trainer-0"), what="SFT trainer Job")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-3:] == ["rlkube.entrypoints.sft", "@", "/etc/rlkube/sft.toml"]
    assert cluster.names("StatefulSet") == set() and cluster.names("Deployment") == set()
    assert cluster.names("Service") == {"sft-sft-trainer-master"}
    sft = tomllib.loads(cluster.get("ConfigMap", "sft-sft-config")["data"]["sft.toml"])
    assert sft["output_dir"] == "/data/sft" and sft["max_steps"] == max_steps
    assert (sft["status_host"], sft["status_port"]) == ("0.0.0.0", 8080)

    # Running: step and checkpoint come from the trainer's rank 0 (pod 0 of the Job).
    orchestrator_status.body = {"phase": "running", "step": 12, "max_steps": max_steps, "loss": 0.5,
                                "last_checkpoint_step": 10}
    await cluster.run_pods(job, 1)
    status = await cluster.until(lambda: cluster.status("SFTRun", "sft").get("step") == 12
                                 and cluster.status("SFTRun", "sft"))
    assert status["phase"] == "Running" and status["lastCheckpointStep"] == 10
    assert orchestrator_status.asked[-1] == ("sft-sft-trainer-master.team-a", "8080")
    # Finished: its status server is gone with it; the final step is the one its rank 0 left in
    # its termination message, not the last one read while it trained, nor max_steps restated.
    orchestrator_status.code = 503
    await cluster.patch("Pod", "sft-sft-trainer-0-0", {"status": pod_succeeded(finished_step=max_steps - 1)})
    await cluster.patch("Job", "sft-sft-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    status = await cluster.until(lambda: cluster.status("SFTRun", "sft")["phase"] == "Succeeded"
                                 and cluster.status("SFTRun", "sft"))
    assert status["step"] == max_steps - 1 and status["lastCheckpointStep"] == 10


async def test_liveness_endpoint_and_operator_metrics(cluster):
    from prometheus_client import generate_latest
    from rlkube_operator import metrics

    await cluster.create(rlrun(name="metered"))
    await start_everything(cluster, "metered")
    async with aiohttp.ClientSession() as session, session.get(cluster.liveness_url) as response:
        assert response.status == 200
    text = generate_latest(metrics.REGISTRY).decode()
    assert 'rlkube_run_phase{kind="RLRun",name="metered",namespace="team-a",phase="Running"} 1.0' in text
    assert 'rlkube_operator_reconciles_total{kind="RLRun",result="ok"}' in text


async def test_stopping_the_operator_lets_the_reconcile_pass_in_flight_finish(cluster, orchestrator_status, caplog):
    """kopf orphans a timer that has not stopped after a few loop cycles: its sync pass would go
    on writing to the API server after the operator has exited."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    orchestrator_status.delay = 1.0
    reads = orchestrator_status.requests
    await cluster.until(lambda: orchestrator_status.requests > reads, what="a status read in flight")
    await cluster.stop_operator()
    assert orchestrator_status.answered == orchestrator_status.requests
    assert "orphaned" not in caplog.text


async def test_storage_scheduling_and_rendezvous_reach_the_running_children(cluster):
    """What test_manifests checks on the pure builders, through the running operator: a PVC
    from `storage.pvc` owned by the run, object-store credentials by reference, scheduling
    knobs on every pod template, and the trainer's torchrun wiring."""
    from tests.operator.test_manifests import GPU_RLRUN

    await cluster.create({"apiVersion": "rlkube.dev/v1alpha1", "kind": "RLRun",
                          "metadata": {"name": "big", "namespace": NS}, "spec": copy.deepcopy(GPU_RLRUN)})
    job = await cluster.until(lambda: cluster.get("Job", "big-trainer-0"), what="trainer Job")
    pvc = await cluster.until(lambda: cluster.get("PersistentVolumeClaim", "big-data"), what="PVC")
    uid = cluster.get("RLRun", "big")["metadata"]["uid"]
    assert pvc["spec"]["storageClassName"] == "fast" and pvc["spec"]["resources"]["requests"]["storage"] == "2Ti"
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == uid

    orchestrator = cluster.get("Deployment", "big-orchestrator")
    owners = [cluster.get("StatefulSet", "big-inference"), orchestrator, job]
    for owner in owners:
        pod = owner["spec"]["template"]["spec"]
        if owner is not orchestrator:  # the run's nodeSelector and tolerations are for GPU pods
            assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
            assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert (pod["priorityClassName"], pod["schedulerName"]) == ("training", "volcano")
        # Weights go by gRPC: inference never touches the store, so it gets no credentials.
        store_users = [] if owner is owners[0] else [{"secretRef": {"name": "s3-creds"}}]
        assert pod["containers"][0].get("envFrom", []) == store_users
        claims = [v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
        assert claims == ["big-data"]

    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 2, 2)
    env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "job-completion-index" in env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["MASTER_ADDR"]["value"] == "big-trainer-master.team-a.svc"
    service = cluster.get("Service", "big-trainer-master")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {
        "rlkube.dev/run": "big", "app.kubernetes.io/component": "trainer", "rlkube.dev/run-uid": uid,
        "batch.kubernetes.io/job-completion-index": "0", "batch.kubernetes.io/job-name": "big-trainer-0"}
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"torchrun": 29500, "weights": 50052,
                                                                         "metrics": TRAINER_METRICS_PORT}
    assert "nodeSelector" not in orchestrator["spec"]["template"]["spec"]


@pytest.mark.usefixtures("crd_rules_off")
async def test_pod_settings_that_override_the_operators_env_are_refused_naming_the_field(cluster):
    run = rlrun()
    run["spec"]["trainer"]["pod"] = {"env": [{"name": "MASTER_ADDR", "value": "elsewhere"}]}
    await cluster.create(run)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    accepted = condition(status, "SpecAccepted")
    assert (status["phase"], accepted["reason"]) == ("Failed", "InvalidSpec")
    assert "trainer.pod: env[0].name 'MASTER_ADDR' is set by the operator" in accepted["message"]
    assert not cluster.names("Job")

    # Under another name the variable reaches the trainer pods, after the operator's own.
    await cluster.patch("RLRun", "rt", {"spec": {"trainer": {"pod": {"env": [{"name": "MY_ADDR", "value": "x"}]}}}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer after the fix")
    env = [e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]]
    assert env[-1] == "MY_ADDR" and "MASTER_ADDR" in env[:-1]


# --- what crosses a pod boundary, ownership, and status that tells the truth -----------------


async def test_the_restarted_attempts_configs_load_in_the_runtime_and_dial_only_services(cluster, tmp_path):
    """The TOMLs the operator renders for attempt 1 (after a gang restart), loaded by the
    runtime's own config loader into the models each process starts from: every address a
    process dials is a Service of this run that survives restarts, never a bind address, and
    every process resumes from the latest checkpoint."""
    from rlkube.config import InferenceConfig, OrchestratorConfig, TrainerConfig, load_config

    await cluster.create(rlrun(config={**example("rlrun.yaml")["spec"]["config"], "weights": {"type": "grpc"}}))
    await start_everything(cluster)
    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_failed()})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="attempt 1")
    await cluster.run_pods(job, 1)

    configs = {}
    for name, model in (("trainer", TrainerConfig), ("orchestrator", OrchestratorConfig),
                        ("inference", InferenceConfig)):
        path = tmp_path / f"{name}.toml"
        path.write_text(cluster.get("ConfigMap", "rt-config")["data"][f"{name}.toml"])
        configs[name] = load_config(model, ["@", str(path)])
    trainer, orchestrator = configs["trainer"], configs["orchestrator"]

    services = {f"{n}.{NS}.svc" for n in cluster.names("Service")}
    dialed = {
        "trainer rollouts.host": trainer.rollouts.host,
        "trainer weights.grpc_host (advertised to inference)": trainer.weights.grpc_host,
        "orchestrator weights.grpc_host": orchestrator.weights.grpc_host,
        **{f"orchestrator client.base_urls[{i}]": url.split("//")[1].split(".", 1)[1].rsplit(":", 1)[0]
           for i, url in enumerate(orchestrator.client.base_urls)},
    }
    for what, host in dialed.items():
        assert host in services, (what, host, services)
    assert trainer.weights.grpc_host == f"rt-trainer-master.{NS}.svc"
    assert trainer.weights.grpc_bind_host == "0.0.0.0" and orchestrator.rollouts.host == "0.0.0.0"
    assert configs["inference"].host == "0.0.0.0"
    assert trainer.ckpt.resume_step == orchestrator.ckpt.resume_step == "latest"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--master-addr={trainer.weights.grpc_host}" in command

    # The master Service selects pod 0 of this run's trainer, whatever the attempt.
    master = cluster.get("Service", "rt-trainer-master")
    pod0 = cluster.get("Pod", "rt-trainer-1-0")
    assert master["spec"]["selector"].items() <= pod0["metadata"]["labels"].items()
    assert {p["name"]: p["port"] for p in master["spec"]["ports"]} == {
        "torchrun": 29500, "weights": trainer.weights.grpc_port, "metrics": trainer.metrics.prometheus_port}


async def test_a_recreated_run_adopts_nothing_from_its_predecessor(cluster):
    """Delete and recreate under the same name while the garbage collector has not yet removed
    the old children: the new run neither reads nor patches them, and says why it waits."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Succeeded", what="Succeeded")
    await cluster.delete("RLRun", "rt")
    await cluster.until(lambda: cluster.get("RLRun", "rt") is None, what="finalizer released")
    old_config = cluster.get("ConfigMap", "rt-config")

    new = rlrun()
    new["spec"]["config"]["max_steps"] = RL_MAX_STEPS + 5
    uid = (await cluster.create(new))["metadata"]["uid"]
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    assert status["phase"] == "Pending", status  # not Succeeded from the old Job
    await asyncio.sleep(1)  # more reconciles
    status = cluster.status("RLRun", "rt")
    assert status["phase"] == "Pending" and condition(status, "Ready")["reason"] == "PreviousRunTerminating"
    assert "ConfigMap rt-config" in status["message"]
    assert cluster.get("ConfigMap", "rt-config") == old_config  # not adopted, not rewritten

    # The garbage collector removes the old children: the new run makes its own.
    for kind in ("ConfigMap", "Service", "Job", "Secret", "NetworkPolicy"):
        for name in cluster.names(kind):
            await cluster.delete(kind, name)
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="the new run's Job")
    assert job["metadata"]["ownerReferences"][0]["uid"] == uid
    assert f"max_steps = {RL_MAX_STEPS + 5}" in cluster.get("ConfigMap", "rt-config")["data"]["trainer.toml"]
    await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Initializing", what="Initializing")


async def test_an_rlrun_and_an_sftrun_of_the_same_name_keep_apart(cluster):
    """Their children have different names, and one's pods never count for the other."""
    sft = example("sftrun.yaml")
    sft["metadata"]["name"] = "rt"
    await cluster.create(rlrun())
    await cluster.create(sft)
    await start_everything(cluster)
    sft_job = await cluster.until(lambda: cluster.get("Job", "rt-sft-trainer-0"), what="the SFTRun's Job")
    assert cluster.names("ConfigMap") == {"rt-config", "rt-sft-config"}
    assert cluster.names("Service") == {"rt-inference", "rt-orchestrator", "rt-trainer-master",
                                        "rt-sft-trainer-master"}
    assert "sft.toml" in cluster.get("ConfigMap", "rt-sft-config")["data"]
    assert "trainer.toml" in cluster.get("ConfigMap", "rt-config")["data"]

    # The SFTRun's trainer fails: the SFTRun restarts its gang, the RLRun does not notice.
    await cluster.run_pods(sft_job, 1, **pod_failed())
    await cluster.until(lambda: cluster.get("Job", "rt-sft-trainer-1"), what="the SFTRun's restart")
    await asyncio.sleep(1)
    status = cluster.status("RLRun", "rt")
    assert status["restarts"] == 0 and status["phase"] == "Running"
    assert cluster.get("Job", "rt-trainer-0") is not None and cluster.get("Job", "rt-trainer-1") is None


async def test_suspend_never_fails_the_run_when_the_suspension_kills_the_trainer(cluster):
    """The trainer's pods die (exit 143) as the Job is suspended: not a failure, even with no
    restarts left."""
    await cluster.create(rlrun(restartPolicy={"backoffLimit": 0}))
    await start_everything(cluster)
    await cluster.patch("RLRun", "rt", {"spec": {"suspend": True}})
    # As in a cluster: the Job controller kills the pods after the operator suspended the Job.
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0")["spec"]["suspend"], what="Job suspended")
    await cluster.patch("Pod", "rt-trainer-0-0", {"status": pod_failed(exit_code=143)})
    await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Suspended", what="Suspended")
    await asyncio.sleep(1)
    status = cluster.status("RLRun", "rt")
    assert status["phase"] == "Suspended" and status["restarts"] == 0
    assert not [e for e in cluster.events() if e["reason"] in ("Failed", "TrainerRestarted")]

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-1"), what="resumed trainer")
    await cluster.run_pods(job, 1)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Running"
                                 and cluster.status("RLRun", "rt"))
    assert status["restarts"] == 0


async def test_a_running_run_that_degrades_stays_running_and_says_which_component(cluster):
    await cluster.create(rlrun())
    await start_everything(cluster)
    status = cluster.status("RLRun", "rt")
    assert condition(status, "Degraded")["status"] == "False"

    await cluster.patch("Pod", "rt-inference-0", {"status": pod_waiting("CrashLoopBackOff", "back-off 40s", 2)})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Degraded")["status"] == "True"
                                 and cluster.status("RLRun", "rt"))
    degraded = condition(status, "Degraded")
    assert degraded["reason"] == "CrashLoopBackOff" and degraded["message"].startswith("inference: pod rt-inference-0")
    assert status["phase"] == "Running" and "inference CrashLoopBackOff" in status["message"]
    assert condition(status, "Ready")["status"] == "False"
    assert condition(status, "Reconciling")["status"] == "True"  # kstatus: InProgress, not Current

    # Losing readiness is degraded too, and recovering clears it.
    await cluster.patch("Pod", "rt-inference-0", {"status": pod_running(ready=False)})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Degraded")["reason"] == "Starting"
                                 and cluster.status("RLRun", "rt"))
    assert status["phase"] == "Running"
    await cluster.patch("Pod", "rt-inference-0", {"status": pod_running()})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Degraded")["status"] == "False"
                                 and cluster.status("RLRun", "rt"))
    assert condition(status, "Ready")["status"] == "True" and status["phase"] == "Running"


async def test_a_failing_reconcile_writes_its_error_to_the_status(cluster):
    import threading

    broken = threading.Event()
    broken.set()
    cluster.server["fetch v1/configmaps", broken] << 403 << {
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'configmaps "rt-config" is forbidden: User "system:serviceaccount:x:y" cannot get resource'}
    await cluster.create(rlrun())
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") and cluster.status("RLRun", "rt"))
    ready = condition(status, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReconcileError")
    assert "403" in ready["message"] and "cannot get resource" in ready["message"]
    assert status["message"].startswith("ReconcileError: ")
    await cluster.until(lambda: [e for e in cluster.events() if e["reason"] == "ReconcileError"], what="an event")

    broken.clear()  # the permission is granted: the next pass goes through
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "Ready")["reason"] != "ReconcileError",
                        what="the error cleared")


async def test_a_pod_stuck_on_a_volume_is_reported_with_the_volume_error(cluster):
    await cluster.create(rlrun())
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    await cluster.run_pods(job, 1, **pod_creating())
    pod = cluster.get("Pod", "rt-trainer-0-0")
    message = ('Multi-Attach error for volume "pvc-1" Volume is already used by pod(s) rt-inference-0')
    await cluster.create({
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "rt-trainer-0-0.1"},
        "involvedObject": {"kind": "Pod", "name": "rt-trainer-0-0", "namespace": NS, "uid": pod["metadata"]["uid"]},
        "reason": "FailedAttachVolume", "type": "Warning", "message": message,
    })
    status = await cluster.until(
        lambda: condition(cluster.status("RLRun", "rt"), "TrainerReady")["reason"] == "FailedAttachVolume"
        and cluster.status("RLRun", "rt"))
    assert condition(status, "TrainerReady")["message"] == f"pod rt-trainer-0-0: {message}"
    assert status["phase"] == "Pending" and "Multi-Attach" in status["message"]


TEACHER = {"model": {"name": "/data/reverse-text-sft-long/weights/final"}, "replicas": 2,
           "resources": {"requests": {"cpu": "2", "memory": "6Gi"}}}


@pytest.mark.parametrize("served", ["teacher", "judge"])
async def test_a_served_model_runs_with_the_run_counts_for_its_readiness_and_goes_when_it_ends(cluster, served):
    """`teacher` (or `judge`): a StatefulSet, headless Service and disruption budget
    `rt-<served>`, owned by the run; the orchestrator's config points at its pods. The run is not
    Running until it is Ready, and its end frees its pods with inference's."""
    uid = (await cluster.create(rlrun(**{served: TEACHER})))["metadata"]["uid"]
    job = await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")
    assert cluster.names("StatefulSet") == {"rt-inference", f"rt-{served}"}
    assert {"rt-inference", f"rt-{served}"} <= cluster.names("Service")
    assert cluster.names("PodDisruptionBudget") == {"rt-inference", f"rt-{served}"}
    for kind in ("StatefulSet", "Service", "PodDisruptionBudget"):
        (owner,) = cluster.get(kind, f"rt-{served}")["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("RLRun", uid, True)
    sts = cluster.get("StatefulSet", f"rt-{served}")
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["serviceName"] == f"rt-{served}"
    (main,) = sts["spec"]["template"]["spec"]["containers"]
    assert main["command"] == ["rlkube", "inference", "@", f"/etc/rlkube/{served}.toml"]
    assert cluster.get("Service", f"rt-{served}")["spec"]["clusterIP"] == "None"
    data = cluster.get("ConfigMap", "rt-config")["data"]
    assert tomllib.loads(data["orchestrator.toml"])[served] == {
        "model": TEACHER["model"]["name"], "served_by_run": True,
        "base_urls": [f"http://rt-{served}-{i}.rt-{served}.{NS}.svc:8000" for i in range(2)]}
    assert tomllib.loads(data[f"{served}.toml"])["model"] == TEACHER["model"]

    await cluster.run_pods(cluster.get("StatefulSet", "rt-inference"), 1)
    await cluster.run_pods(cluster.get("Deployment", "rt-orchestrator"), 1)
    await cluster.run_pods(job, 1)
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), "TrainerReady")["status"] == "True"
                                 and cluster.status("RLRun", "rt"), what="the others Ready")
    assert status["phase"] == "Initializing" and condition(status, f"{served.capitalize()}Ready")["reason"] == "NoPods"
    assert condition(status, "Ready")["status"] == "False"
    await cluster.run_pods(sts, 2)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Running"
                                 and cluster.status("RLRun", "rt"), what="Running")
    assert condition(status, f"{served.capitalize()}Ready")["status"] == "True"

    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    await cluster.until(lambda: not cluster.names("StatefulSet") and not cluster.names("PodDisruptionBudget"),
                        what=f"inference and {served} torn down")
    await cluster.until(lambda: condition(cluster.status("RLRun", "rt"), f"{served.capitalize()}Ready")["reason"] == "Succeeded",
                        what=f"the {served} stopped with the run")


@pytest.mark.parametrize("served", ["teacher", "judge"])
async def test_a_suspended_run_scales_its_served_model_to_zero_and_may_drop_it(cluster, served):
    """Suspended, the teacher (or judge) is at zero with inference. Its block removed while
    suspended (accepted: it keeps nothing of the run), its children and config go, and so does
    its condition; the run resumes without it."""
    await cluster.create(rlrun(**{served: TEACHER}, suspend=True))
    await cluster.until(lambda: cluster.get("StatefulSet", f"rt-{served}"), what=served)
    assert cluster.get("StatefulSet", f"rt-{served}")["spec"]["replicas"] == 0
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("phase") == "Suspended"
                                 and cluster.status("RLRun", "rt"), what="Suspended")
    assert condition(status, f"{served.capitalize()}Ready")["reason"] == "Suspended"

    await cluster.patch("RLRun", "rt", {"spec": {served: None}})
    await cluster.until(lambda: not {f"rt-{served}"} & (cluster.names("StatefulSet") | cluster.names("Service")
                                                      | cluster.names("PodDisruptionBudget")), what=f"{served} gone")
    status = await cluster.until(lambda: f"{served.capitalize()}Ready" not in {c["type"] for c in cluster.status("RLRun", "rt")[
        "conditions"]} and cluster.status("RLRun", "rt"), what="its condition gone")
    assert condition(status, "SpecAccepted")["status"] == "True"
    data = cluster.get("ConfigMap", "rt-config")["data"]
    assert f"{served}.toml" not in data and served not in tomllib.loads(data["orchestrator.toml"])

    await cluster.patch("RLRun", "rt", {"spec": {"suspend": False}})
    await cluster.until(lambda: cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 1, what="resumed")
    assert cluster.names("StatefulSet") == {"rt-inference"}


async def test_progress_an_operator_outside_the_cluster_cannot_read_is_a_condition(kmock):
    """The default URL (`<run>-orchestrator.<ns>.svc`) does not resolve outside a cluster: the
    run says so, from where and why, instead of leaving STEP and REWARD empty in silence."""
    from rlkube_operator.progress import DEFAULT_URL_TEMPLATE

    async with running_operator(kmock, DEFAULT_URL_TEMPLATE, interval=0.3, progress_interval=0.0) as cluster:
        await cluster.create(rlrun())
        await start_everything(cluster)
        url = f"http://rt-orchestrator.{NS}.svc:8080/status"
        unreadable = await cluster.until(
            lambda: next((c for c in cluster.status("RLRun", "rt")["conditions"] if c["type"] == "ProgressReadable"),
                         None), what="ProgressReadable")
        assert (unreadable["status"], unreadable["reason"]) == ("False", "Unreachable"), unreadable
        assert unreadable["message"].startswith(f"status from {url}: "), unreadable
        assert cluster.status("RLRun", "rt")["phase"] == "Running" and "step" not in cluster.status("RLRun", "rt")


async def test_the_tool_service_deployment_is_left_to_kubectl_scale_until_its_spec_replicas_change(cluster):
    """`toolService.replicas: 2`: a Deployment owned by the run, created with 2 pods; a `kubectl
    scale` of the Deployment to 4 holds through the operator's passes (it does not fight it);
    a change of `spec.toolService.replicas` on the running run (3) is applied, and stays."""
    await cluster.create(rlrun(toolService={"replicas": 2}))
    tools = await cluster.until(lambda: cluster.get("Deployment", "rt-tool-service"), what="tool service")
    assert tools["spec"]["replicas"] == 2 and cluster.get("Service", "rt-tool-service") is not None
    await start_everything(cluster)
    await cluster.patch("Deployment", "rt-tool-service", {"spec": {"replicas": 4}})  # kubectl scale
    await cluster.patch("RLRun", "rt", {"spec": {"ttlSecondsAfterFinished": 600}})  # a live change: a pass
    await cluster.until(lambda: cluster.status("RLRun", "rt").get("observedGeneration") == 2, what="the pass")
    await asyncio.sleep(1.0)
    assert cluster.get("Deployment", "rt-tool-service")["spec"]["replicas"] == 4, "the scale holds"

    await cluster.patch("RLRun", "rt", {"spec": {"toolService": {"replicas": 3}}})
    await cluster.until(lambda: cluster.get("Deployment", "rt-tool-service")["spec"]["replicas"] == 3,
                        what="the spec's new replicas")
    await asyncio.sleep(1.0)
    assert cluster.get("Deployment", "rt-tool-service")["spec"]["replicas"] == 3
    assert condition(cluster.status("RLRun", "rt"), "SpecAccepted")["status"] == "True"


async def test_inference_replicas_change_live_without_touching_the_trainer_or_orchestrator(cluster):
    """`kubectl scale rlrun` (or an apply) of `spec.inference.replicas` on a running run resizes
    the StatefulSet and the replica list the orchestrator reads again (`inference_urls`), and
    leaves the trainer Job and the orchestrator's pod template as they were; `status.inference`
    is what the scale subresource and the `Inference` column read. Over NCCL it is refused."""
    await cluster.create(rlrun())
    await start_everything(cluster)
    job, orchestrator = cluster.get("Job", "rt-trainer-0"), cluster.get("Deployment", "rt-orchestrator")
    status = await cluster.until(lambda: (cluster.status("RLRun", "rt").get("inference") or {}).get("ready") == "1/1"
                                 and cluster.status("RLRun", "rt"))
    assert status["inference"]["replicas"] == 1 and "app.kubernetes.io/component=inference" in \
        status["inference"]["selector"]

    await cluster.patch("RLRun", "rt", {"spec": {"inference": {"replicas": 2}}})
    await cluster.until(lambda: cluster.get("StatefulSet", "rt-inference")["spec"]["replicas"] == 2, what="2 replicas")
    urls = cluster.get("ConfigMap", "rt-config")["data"]["inference_urls"].split()
    assert urls == [f"http://rt-inference-{i}.rt-inference.{NS}.svc:8000" for i in range(2)]
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["inference"]["ready"] == "1/2"
                                 and cluster.status("RLRun", "rt"))
    assert condition(status, "SpecAccepted")["status"] == "True" and status["restarts"] == 0
    refused = [e["message"] for e in cluster.events()
               if e["reason"] == "ChangeRequiresRecreate" and e["involvedObject"]["name"] == "rt"]
    assert not refused, "a scale is never refused, not even for one pass"
    assert cluster.get("Job", "rt-trainer-0")["metadata"]["uid"] == job["metadata"]["uid"]
    assert cluster.get("Deployment", "rt-orchestrator")["spec"]["template"] == orchestrator["spec"]["template"]
    mounted = orchestrator["spec"]["template"]["spec"]["volumes"][0]["configMap"]["items"]
    assert {"key": "inference_urls", "path": "inference_urls"} in mounted

    base = rlrun()["spec"]["config"]
    nccl = {**base, "weights": {"type": "nccl"}, "trainer": {**base.get("trainer", {}), "device": "cuda"}}
    await cluster.create(rlrun("nc", config=nccl))
    await start_everything(cluster, "nc")
    await cluster.patch("RLRun", "nc", {"spec": {"inference": {"replicas": 2}}})
    status = await cluster.until(lambda: condition(cluster.status("RLRun", "nc"), "SpecAccepted")["status"] == "False"
                                 and cluster.status("RLRun", "nc"))
    assert "spec.inference.replicas" in condition(status, "SpecAccepted")["message"]
    assert cluster.get("StatefulSet", "nc-inference")["spec"]["replicas"] == 1
