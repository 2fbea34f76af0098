"""Pod-template pieces every component shares: volumes, the container, scheduling (pure)."""

from rlkube_operator.names import CONFIG_MOUNT, RunRef
from rlkube_operator.spec import Resources, RunSpecBase
from rlkube_operator.wiring import EMPTYDIR_OUTPUT

GPU_RESOURCE = "nvidia.com/gpu"


def resources(res: Resources, gpus: int) -> dict:
    """Requests/limits as given; GPUs are set on both (Kubernetes requires requests == limits)."""
    requests = {k: str(v) for k, v in res.requests.items()}
    limits = {k: str(v) for k, v in res.limits.items()}
    if gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def volumes(run: RunRef, spec: RunSpecBase, config_files: list[str]) -> list[dict]:
    pvc = spec.storage.pvc
    data = (
        {"persistentVolumeClaim": {"claimName": pvc.claim_name or run.child("data")}}
        if pvc
        else {"emptyDir": {}}
    )
    return [
        {
            "name": "config",
            "configMap": {
                "name": run.child("config"),
                "items": [{"key": f, "path": f} for f in config_files],
            },
        },
        {"name": "data", **data},
        # PyTorch and vLLM share tensors between processes through /dev/shm.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "tmp", "emptyDir": {}},
    ]


def volume_mounts(spec: RunSpecBase) -> list[dict]:
    data_path = spec.storage.pvc.mount_path if spec.storage.pvc else EMPTYDIR_OUTPUT
    return [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "data", "mountPath": data_path},
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def container(
    spec: RunSpecBase,
    name: str,
    command: list[str],
    *,
    ports: list[dict],
    res: Resources,
    gpus: int = 0,
    env: list[dict] | None = None,
    probes: dict | None = None,
) -> dict:
    store = spec.storage.object_store
    env = list(env or []) + [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    if store and store.endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": store.endpoint_url})
    out = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "ports": ports,
        "env": env,
        "resources": resources(res, gpus),
        "volumeMounts": volume_mounts(spec),
        "securityContext": container_security(spec),
        **(probes or {}),
    }
    if store and store.secret_name:
        # Credentials stay in the user's Secret; the pod reads them, the operator never does.
        out["envFrom"] = [{"secretRef": {"name": store.secret_name}}]
    return out


def container_security(spec: RunSpecBase) -> dict:
    out = {"allowPrivilegeEscalation": False}
    if spec.security_context and spec.security_context.run_as_non_root:
        out["capabilities"] = {"drop": ["ALL"]}
    return out


def pod_spec(run: RunRef, spec: RunSpecBase, containers: list[dict], config_files: list[str], **extra) -> dict:
    sched = spec.scheduling
    out = {
        "containers": containers,
        "volumes": volumes(run, spec, config_files),
        "enableServiceLinks": False,
        **extra,
    }
    optional = {
        "nodeSelector": sched.node_selector or None,
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in sched.tolerations] or None,
        "priorityClassName": sched.priority_class_name,
        "schedulerName": sched.scheduler_name,
        "serviceAccountName": spec.service_account_name,
        "imagePullSecrets": [{"name": s} for s in spec.image_pull_secrets] or None,
        "securityContext": spec.security_context.model_dump(by_alias=True, exclude_none=True)
        if spec.security_context else None,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def http_probes(path: str, port: str, startup_timeout_s: float) -> dict:
    """Startup probe allows the whole startup timeout (model load), then liveness/readiness."""
    get = {"httpGet": {"path": path, "port": port}}
    return {
        "startupProbe": {**get, "periodSeconds": 10, "failureThreshold": max(1, int(startup_timeout_s // 10))},
        "readinessProbe": {**get, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**get, "periodSeconds": 15, "failureThreshold": 4},
    }
