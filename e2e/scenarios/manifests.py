"""Manifests the scenarios apply: the operator (local cluster only; on a real cluster the Helm
chart installs it) and the reverse-text example runs, shortened for CPU-minutes."""

import copy
from pathlib import Path
from urllib.parse import urlsplit

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "reverse_text"
OPERATOR = "rlkube-operator"


def example(name: str) -> list[dict]:
    return list(yaml.safe_load_all((EXAMPLES / name).read_text()))


def operator_manifests(cluster) -> list[dict]:
    """The operator as a Deployment of one pod, talking to the API server through a kubeconfig
    (the local API server has no service-account tokens). It resyncs runs and writes their
    progress every 2 s, as the scenarios expect (events of the children wake it sooner)."""
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    for entry in kubeconfig["clusters"]:
        server = urlsplit(entry["cluster"]["server"])
        entry["cluster"]["server"] = f"{server.scheme}://{cluster.host_address}:{server.port}"
    labels = {"app.kubernetes.io/name": OPERATOR}
    config_map = {
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{OPERATOR}-kubeconfig"},
        "data": {"config": yaml.safe_dump(kubeconfig)},
    }
    container = {
        "name": "operator",
        "image": "ghcr.io/rlkube/rlkube-operator:0.1.0",
        "command": ["rlkube-operator", "--namespace", cluster.namespace, "--interval", "2",
                    "--progress-interval", "2", "--metrics-port", "0", "--liveness", "http://0.0.0.0:8081/healthz"],
        "env": [{"name": "KUBECONFIG", "value": "/etc/kube/config"}],
        "volumeMounts": [{"name": "kubeconfig", "mountPath": "/etc/kube", "readOnly": True}],
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8081}, "periodSeconds": 10,
                          "failureThreshold": 6, "initialDelaySeconds": 30},
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": OPERATOR, "labels": labels},
        "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {
                "containers": [container],
                "volumes": [{"name": "kubeconfig", "configMap": {"name": f"{OPERATOR}-kubeconfig"}}],
            }},
        },
    }
    return [config_map, deployment]


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


def short_rl(name: str, model: str, claim: str, max_steps: int, **config_overrides) -> dict:
    """examples/reverse_text/rlrun.yaml on `claim`, from `model`, `max_steps` long, checkpoints
    every 2 steps, smaller batches, so a step takes seconds on two cores."""
    (run,) = copy.deepcopy(example("rlrun.yaml"))
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
