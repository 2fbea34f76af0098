"""Who may write the run's claim (issue 41, item 2): only the trainer's pods. The orchestrator,
whose environments run code the policy wrote, writes its own two directories (its output and
its checkpoint parts) and nothing the trainer loads; env workers and the servers write nothing.
Checked on the pod specs the real builders make, then across the boundary: those pods run in
the local cluster's kubelet (real mount namespaces, the claim bind-mounted as the specs say)
and try the writes themselves."""

import base64
import tomllib
from pathlib import PurePosixPath

import kubernetes_validate
import pytest
from rlkube_operator import builders
from rlkube_operator.names import CHECKPOINT_KEY, CHECKPOINT_KEY_ENV, RunRef
from rlkube_operator.reconcile import WORKLOADS
from rlkube_operator.spec import RLRunSpec

from tests.cluster.test_kubelet import cluster, kmock_options, phase  # noqa: F401
from tests.operator.cluster import NS
from tests.operator.test_manifests import GPU_RLRUN, JUDGE, K8S_VERSION

RUN = RunRef("RLRun", "rt", NS, "5678-uid")
MOUNT = "/data"
SPEC = RLRunSpec.model_validate(GPU_RLRUN | {
    "storage": {"pvc": {"mountPath": MOUNT, "accessModes": ["ReadWriteMany"]}}, "envWorkers": {"replicas": 1}, "judge": JUDGE,
    "config": GPU_RLRUN["config"] | {"ckpt": {"interval": 1}, "orchestrator": {"envs": [{"id": "judged_reverse_text"}]}},
})
TRAINER_FILES = [f"{MOUNT}/rt/checkpoints/trainer/step_1/dcp/.metadata", f"{MOUNT}/rt/compile_cache/key/entry.py",
                 f"{MOUNT}/rt/weights/step_1/model.safetensors"]
"""What the trainer loads (DCP's pickle, Inductor's code) or publishes to inference."""


def workloads() -> list[dict]:
    workload = WORKLOADS["RLRun"]
    return [
        builders.build_inference_statefulset(RUN, SPEC, 1),
        builders.build_served_statefulset(RUN, SPEC, "judge", 1),
        builders.build_orchestrator_deployment(RUN, SPEC, 1, 0),
        builders.build_env_worker_deployment(RUN, SPEC, 1),
        builders.build_trainer_job(RUN, SPEC, module=workload.module, config_file=workload.config_file, attempt=0,
                                   restarts=0, suspend=False, status_port=workload.trainer_status_port),
    ]


def pod_templates() -> dict[str, dict]:
    """component -> pod template, as the operator makes them for `SPEC`."""
    templates = (obj["spec"]["template"] for obj in workloads())
    return {t["metadata"]["labels"]["app.kubernetes.io/component"]: t for t in templates}


def test_the_workloads_validate_against_the_kubernetes_schemas():
    for obj in workloads():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def writable(template: dict) -> list[str]:
    """The paths under which a pod may write the claim: its read-write mounts of `data`."""
    (main,) = template["spec"]["containers"]
    return [m["mountPath"] for m in main["volumeMounts"] if m["name"] == "data" and not m.get("readOnly")]


def test_only_the_trainer_may_write_what_the_trainer_loads():
    templates = pod_templates()
    assert set(templates) == {"inference", "judge", "orchestrator", "env-worker", "trainer"}
    assert writable(templates["trainer"]) == [MOUNT]
    for component, template in templates.items():
        if component == "trainer":
            continue
        for path in writable(template):  # neither the file nor a directory above it
            assert not any(PurePosixPath(f).is_relative_to(path) for f in TRAINER_FILES), (component, path)
    assert writable(templates["orchestrator"]) == [f"{MOUNT}/rt/orchestrator", f"{MOUNT}/rt/checkpoints/orchestrator"]
    for component in ("env-worker", "inference", "judge"):
        assert writable(templates[component]) == [], component


def test_the_orchestrator_writes_where_its_mounts_are_and_checkpoints_beside_the_trainer():
    tomls = WORKLOADS["RLRun"].tomls(RUN, SPEC)
    orchestrator, trainer = tomllib.loads(tomls["orchestrator.toml"]), tomllib.loads(tomls["trainer.toml"])
    assert orchestrator["output_dir"] == f"{MOUNT}/rt/orchestrator"
    assert orchestrator["ckpt"]["url"] == f"{trainer['output_dir']}/checkpoints", "the trainer's default root"


def test_only_the_trainer_gets_the_checkpoint_key():
    secret = builders.build_token_secret(RUN, b"k" * 32)
    values = {name: base64.b64decode(value).decode() for name, value in secret["data"].items()}
    key = values.pop(CHECKPOINT_KEY)
    assert len(key) == 43 and key not in values.values(), "no scope's credential is the key"
    for component, template in pod_templates().items():
        (main,) = template["spec"]["containers"]
        names = [e["name"] for e in main["env"]]
        assert (CHECKPOINT_KEY_ENV in names) == (component == "trainer"), component


PROBE = """
import os, sys
move, paths = sys.argv[1] == "move", sys.argv[2:]
for path in paths:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
        print("wrote", path)
    except OSError as e:
        print("refused", path, e.strerror)
for old in ("/data/rt/checkpoints", "/data/rt") if move else ():  # the trainer's tree aside, to plant another
    try:
        os.rename(old, old + ".moved")
        print("moved", old)
    except OSError as e:
        print("refused moving", old, e.strerror)
print("key", bool(os.environ.get("RLKUBE_CHECKPOINT_KEY")), flush=True)
"""


def as_pod(name: str, template: dict, args: list[str]) -> dict:
    """The component's pod as the operator makes it (volumes, mounts, security context, env),
    running the probe from the venv instead of its image."""
    spec = dict(template["spec"])
    (main,) = spec["containers"]
    spec["containers"] = [main | {"image": "venv", "command": ["python", "-c", PROBE, *args],
                                  "ports": [], "resources": {}}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec["containers"][0].pop(probe, None)
    spec["restartPolicy"] = "Never"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": template["metadata"]["labels"]},
            "spec": spec}


async def run_pod(cluster, name: str, template: dict, *args: str) -> list[str]:  # noqa: F811
    await cluster.create(as_pod(name, template, list(args)))
    await cluster.until(lambda: phase(cluster, name) in ("Succeeded", "Failed"), 60, f"{name} to end")
    out = cluster.logs(name, template["spec"]["containers"][0]["name"]).splitlines()
    assert phase(cluster, name) == "Succeeded", out
    return out


@pytest.mark.slow
async def test_pods_of_the_run_write_the_claim_only_where_their_specs_allow(cluster):  # noqa: F811
    """The orchestrator starts first on a fresh claim (the kubelet makes its subPath
    directories), then the trainer, then an env worker; each tries the trainer's files, the
    orchestrator's, and moving the trainer's tree aside."""
    workload = WORKLOADS["RLRun"]
    for obj in (builders.build_configmap(RUN, workload.tomls(RUN, SPEC), {}, b"k" * 32), builders.build_token_secret(RUN, b"k" * 32),
                builders.build_pvc(RUN, SPEC)):
        await cluster.create(obj | {"metadata": {k: v for k, v in obj["metadata"].items() if k != "ownerReferences"}})
    templates = pod_templates()
    ours = [f"{MOUNT}/rt/orchestrator/metrics/orchestrator.jsonl", f"{MOUNT}/rt/checkpoints/orchestrator/step_1/state.json"]

    orchestrator = await run_pod(cluster, "orchestrator", templates["orchestrator"], "move", *TRAINER_FILES, *ours)
    assert orchestrator == [*(f"refused {f} Read-only file system" for f in TRAINER_FILES),
                            *(f"wrote {f}" for f in ours),
                            "refused moving /data/rt/checkpoints Read-only file system",
                            "refused moving /data/rt Read-only file system", "key False"]

    trainer = await run_pod(cluster, "trainer", templates["trainer"], "stay", *TRAINER_FILES)
    assert trainer[:len(TRAINER_FILES)] == [f"wrote {f}" for f in TRAINER_FILES] and trainer[-1] == "key True"

    worker = await run_pod(cluster, "env-worker", templates["env-worker"], "move", *TRAINER_FILES, *ours)
    assert worker == [*(f"refused {f} Read-only file system" for f in TRAINER_FILES + ours),
                      "refused moving /data/rt/checkpoints Read-only file system",
                      "refused moving /data/rt Read-only file system", "key False"]
