"""Black-box: the operator runs (embedded kopf) against kmock's API emulator; tests apply runs,
play the controllers and kubelets, and read back children, status and events."""

import copy
import tomllib
from pathlib import Path

import yaml

from tests.operator.cluster import NS, pod_failed, pod_running, pod_unschedulable, pod_waiting

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"


def example(name: str) -> dict:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d["kind"] in ("RLRun", "SFTRun")]
    return copy.deepcopy(docs[0])


def rlrun(name: str = "rt", **spec) -> dict:
    run = example("rlrun.yaml")
    run["metadata"]["name"] = name
    run["spec"].update(spec)
    return run


def condition(status: dict, type_: str) -> dict:
    return next(c for c in status.get("conditions", []) if c["type"] == type_)


async def test_rlrun_creates_every_child_with_the_right_spec(cluster):
    run = await cluster.create(rlrun(inference={"replicas": 2}))
    uid = run["metadata"]["uid"]
    await cluster.until(lambda: cluster.get("Job", "rt-trainer-0"), what="trainer Job")

    assert cluster.names("ConfigMap") == {"rt-config"}
    assert cluster.names("Service") == {"rt-inference", "rt-orchestrator", "rt-trainer"}
    assert cluster.names("StatefulSet") == {"rt-inference"}
    assert cluster.names("Deployment") == {"rt-orchestrator"}
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
    assert pod["subdomain"] == "rt-trainer" and pod["restartPolicy"] == "Never"
    command = pod["containers"][0]["command"]
    assert command[:2] == ["torchrun", "--nnodes=1"]
    assert "--master-addr=rt-trainer-0-0.rt-trainer.team-a.svc" in command
    assert command[-3:] == ["rlkube.entrypoints.trainer", "@", "/etc/rlkube/trainer.toml"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "reverse-text-data"

    data = cluster.get("ConfigMap", "rt-config")["data"]
    orchestrator = tomllib.loads(data["orchestrator.toml"])
    assert orchestrator["client"]["base_urls"] == [
        f"http://rt-inference-{i}.rt-inference.{NS}.svc:8000" for i in range(2)
    ]
    assert orchestrator["rollouts"]["host"] == "0.0.0.0"
    trainer = tomllib.loads(data["trainer.toml"])
    assert trainer["rollouts"]["host"] == f"rt-orchestrator.{NS}.svc"
    assert trainer["output_dir"] == "/data/rt" and "resume_step" not in trainer["ckpt"]
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

    # Everything comes up; step and reward come from the orchestrator's /status.
    orchestrator_status.body |= {"phase": "running", "step": 7, "reward": 0.42, "last_checkpoint_step": 5}
    await cluster.patch("Pod", "rt-inference-0", {"status": pod_running()})
    await cluster.run_pods(cluster.get("Deployment", "rt-orchestrator"), 1)
    await cluster.run_pods(cluster.get("Job", "rt-trainer-0"), 1)
    status = await cluster.until(lambda: cluster.status("RLRun", "rt").get("step") == 7
                                 and cluster.status("RLRun", "rt"))
    assert status["phase"] == "Running"
    assert (status["reward"], status["lastCheckpointStep"], status["maxSteps"]) == (0.42, 5, 20)
    for type_ in ("Ready", "Progressing", "InferenceReady", "OrchestratorReady", "TrainerReady", "SpecAccepted"):
        assert condition(status, type_)["status"] == "True", type_
        assert condition(status, type_)["observedGeneration"] == 1
    assert status["observedGeneration"] == 1
    reasons = {e["reason"] for e in cluster.events() if e.get("involvedObject", {}).get("name") == "rt"}
    assert {"Initializing", "Pending", "Running"} <= reasons

    # The trainer Job completes: Succeeded, inference and orchestrator torn down, storage kept.
    await cluster.patch("Job", "rt-trainer-0", {"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
    status = await cluster.until(lambda: cluster.status("RLRun", "rt")["phase"] == "Succeeded"
                                 and cluster.status("RLRun", "rt"))
    await cluster.until(lambda: not cluster.names("StatefulSet") and not cluster.names("Deployment"),
                        what="teardown")
    assert status["step"] == 20 and status["completionTime"]
    assert cluster.names("ConfigMap") == {"rt-config"}
    assert condition(status, "Ready")["status"] == "True"
