"""Each pod of a run holds exactly its component's credentials (`rlkube.scopes.HELD`) and nothing
they derive from: no run token (`RLKUBE_TOKEN`, from which every scope derives), no other
Secret key of the run's; and the programs an environment starts in the pods that run
environments (orchestrator, env workers) see none of them.

The exploit: a pod given more than its part (the run's token, another scope's key, the whole
Secret through `envFrom` or a volume) hands it to whatever takes that pod over, an env worker's
program first among them. Every pod kind of a run is built by the operator's real reconcile
(`threatmodel.build_run`: an RLRun with every component, its tool service and export Job
included, under gRPC, NCCL and store weights; an SFTRun), and the env programs' view is that of a real `rlkube orchestrator` started with the
pod's environment, its credentials' values read from the Secret the operator builds."""

import base64
import os
import subprocess
import sys

import pytest
from rlkube.scopes import HELD, SCOPES, scope_env
from rlkube.withheld import TOKEN_ENV
from rlkube_operator import threatmodel
from rlkube_operator.names import CHECKPOINT_KEY, CHECKPOINT_KEY_ENV

from tests.envs.test_withheld import SERVE

PODS = [(f"{variant or 'grpc'}:{component}", objects, component, pod)
        for variant, (kind, spec) in threatmodel.VARIANTS.items()
        for objects in [threatmodel.build_run(kind, spec)]
        for component, pod in threatmodel.pod_templates(objects).items()]


def token_secret(objects: list[dict]) -> dict:
    (secret,) = [o for o in objects if o["kind"] == "Secret"]
    return secret


def containers(pod: dict) -> list[dict]:
    return pod["spec"]["containers"] + pod["spec"].get("initContainers", [])


@pytest.mark.parametrize(("name", "objects", "component", "pod"), PODS, ids=[p[0] for p in PODS])
def test_a_pod_holds_exactly_its_components_credentials(name, objects, component, pod):
    secret = token_secret(objects)
    assert set(secret["data"]) == {*SCOPES, CHECKPOINT_KEY}, "the scopes' credentials and the checkpoint key, not the token"
    for container in containers(pod):
        env = container.get("env", [])
        assert TOKEN_ENV not in {e["name"] for e in env}
        from_secret = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env
                       if e.get("valueFrom", {}).get("secretKeyRef", {}).get("name") == secret["metadata"]["name"]}
        expected = {scope_env(s): {"name": secret["metadata"]["name"], "key": s} for s in HELD[component]}
        if component in ("trainer", "export"):  # the trainer signs and checks its checkpoints, the export checks them
            expected[CHECKPOINT_KEY_ENV] = {"name": secret["metadata"]["name"], "key": CHECKPOINT_KEY, "optional": True}
        assert from_secret == expected
        assert not [e for e in container.get("envFrom", []) if e.get("secretRef", {}).get("name") == secret[
            "metadata"]["name"]]
    for volume in pod["spec"].get("volumes", []):
        assert volume.get("secret", {}).get("secretName") != secret["metadata"]["name"], volume
        for source in volume.get("projected", {}).get("sources", []):
            assert source.get("secret", {}).get("name") != secret["metadata"]["name"], volume


def pod_environment(objects: list[dict], pod: dict) -> dict[str, str]:
    """The main container's environment as the kubelet makes it: literal values, and the run's
    Secret's keys resolved (fieldRefs and other Secrets have no value here)."""
    secret = token_secret(objects)
    values = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    out = {}
    for e in pod["spec"]["containers"][0].get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        elif (ref := e.get("valueFrom", {}).get("secretKeyRef", {})).get("name") == secret["metadata"]["name"]:
            out[e["name"]] = values[ref["key"]]
    return out


ENV_HOSTS = [p for p in PODS if p[0].startswith("grpc:") and p[2] in ("orchestrator", "env-worker")]


@pytest.mark.parametrize(("name", "objects", "component", "pod"), ENV_HOSTS, ids=[p[0] for p in ENV_HOSTS])
def test_env_programs_see_none_of_the_pods_credentials(name, objects, component, pod, tmp_path):
    """A program an environment runs (through verifiers' subprocess runtime), in a process
    started as `rlkube orchestrator` and `rlkube env-worker` start (`serve_main`) with this
    pod's environment: no credential of the pod in its environment or in its parent's."""
    assert [c["command"][:2] for c in pod["spec"]["containers"]] == [["rlkube", component]]
    environment = pod_environment(objects, pod)
    credentials = {n: v for n, v in environment.items() if n.startswith("RLKUBE_TOKEN")}
    assert set(credentials) == {scope_env(s) for s in HELD[component]}
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLKUBE_TOKEN")}
    env = base | environment | {"HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", SERVE]
    if os.geteuid() == 0:  # without CAP_SYS_PTRACE, as in a pod (every capability dropped)
        argv = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *argv]
    done = subprocess.run(argv, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    own, parent = done.stdout.split("--- parent")
    assert "PATH=" in own
    assert not [n for n, v in credentials.items() if v in own], own
    assert "Permission denied" in parent and not [n for n, v in credentials.items() if v in parent], parent
