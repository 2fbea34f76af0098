"""Manifests the scenarios apply: the operator (local cluster only, rendered from the Helm chart;
on a real cluster `helm install` installs the same chart) and the reverse-text example runs,
shortened for CPU-minutes."""

import copy
import json
from pathlib import Path
from urllib.parse import urlsplit

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
OPERATOR_VALUES = Path(__file__).resolve().parents[1] / "operator-values.yaml"
OPERATOR_DOCKERFILE = Path(__file__).resolve().parents[2] / "images" / "operator.Dockerfile"
OPERATOR = "rlkube-operator"


def example(name: str) -> list[dict]:
    return list(yaml.safe_load_all((EXAMPLES / name).read_text()))


def operator_manifests(cluster) -> list[dict]:
    """The operator as the Helm chart installs it (rendered by the real Helm engine), with
    `e2e/operator-values.yaml` as on kind: 2 replicas electing a leader, the guardrails (a
    ValidatingAdmissionPolicy the local API server enforces). What differs for the local cluster:
    the CRDs are served from `crds/` (it serves no CustomResourceDefinition kind), the pods reach
    the API through a kubeconfig in a ConfigMap (it has no service-account tokens), and the
    container's command is the image's ENTRYPOINT (which the venv standing in for images lacks)."""
    from tests.operator.test_helm import render

    values = yaml.safe_load(OPERATOR_VALUES.read_text()) | {"crds": {"install": False}}
    objects = render(values, name="rlkube", namespace=cluster.namespace)
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in kubeconfig["clusters"]:
        server = urlsplit(entry["cluster"]["server"])
        entry["cluster"]["server"] = f"{server.scheme}://{cluster.host_address}:{server.port}"
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{OPERATOR}-kubeconfig"},
        "data": {"config": yaml.safe_dump(kubeconfig)},
    }
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    pod["volumes"].append({"name": "kubeconfig", "configMap": {"name": config_map["metadata"]["name"]}})
    (container,) = pod["containers"]
    container["command"] = image_entrypoint(OPERATOR_DOCKERFILE)  # the venv stand-in has no ENTRYPOINT
    container["env"].append({"name": "KUBECONFIG", "value": "/etc/kube/config"})
    container["volumeMounts"].append({"name": "kubeconfig", "mountPath": "/etc/kube", "readOnly": True})
    return [config_map, *objects]


def image_entrypoint(dockerfile: Path) -> list[str]:
    """The image's `ENTRYPOINT` (exec form), what a container without `command` runs."""
    (line,) = [line for line in dockerfile.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    return json.loads(line.removeprefix("ENTRYPOINT "))


def short_sft(model: str, claim: str, max_steps: int) -> tuple[dict, dict]:
    """examples/reverse_text/sftrun.yaml (its claim and its SFTRun), `max_steps` long."""
    pvc, run = copy.deepcopy(example("sftrun.yaml"))
    pvc["metadata"]["name"] = claim
    run["spec"]["storage"]["pvc"]["claimName"] = claim
    config = run["spec"]["config"]
    config["model"]["name"] = model
    config["max_steps"] = max_steps
    config["ckpt"] = {"interval": max_steps, "keep_last": 1}
    return pvc, run


def short_rl(name: str, model: str, claim: str, max_steps: int, manifest: str = "rlrun.yaml",
             **config_overrides) -> dict:
    """examples/reverse_text/rlrun.yaml (or another of its RLRuns, `manifest`) on `claim`, from
    `model`, `max_steps` long, checkpoints every 2 steps, smaller batches, so a step takes seconds
    on two cores."""
    (run,) = copy.deepcopy(example(manifest))
    run["metadata"]["name"] = name
    run["spec"]["storage"]["pvc"]["claimName"] = claim
    config = run["spec"]["config"]
    config["model"]["name"] = model
    config["max_steps"] = max_steps
    config["ckpt"] = {"interval": 2, "keep_last": 2}
    config["orchestrator"] |= {"batch_size": 64}
    config["orchestrator"]["sampling"] |= {"max_tokens": 16}
    for key, value in config_overrides.items():
        section = config
        *parents, leaf = key.split(".")
        for part in parents:
            section = section.setdefault(part, {})
        section[leaf] = value
    return run


def claim(name: str, size: str = "2Gi") -> dict:
    return {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}},
    }
