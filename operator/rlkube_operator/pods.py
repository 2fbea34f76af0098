"""Pod-template pieces every component shares: volumes, the container, scheduling (pure)."""

from rlkube.scopes import HELD, scope_env

from rlkube_operator import gang
from rlkube_operator.names import CONFIG_MOUNT, RunRef
from rlkube_operator.podsettings import PodSettings, Resources
from rlkube_operator.spec import RunSpecBase
from rlkube_operator.wiring import EMPTYDIR_OUTPUT

GPU_RESOURCE = "nvidia.com/gpu"
GPU_COMPONENTS = ("inference", "teacher", "judge", "trainer")
SPEC_SECTION = {"env-worker": "env_workers", "tool-service": "tool_service"}
"""A component's section of the spec, where it is not named as the component."""


def pod_settings(spec: RunSpecBase, component: str) -> PodSettings:
    """The component's own `pod` section over the run-level defaults. The run's nodeSelector
    and tolerations are meant for the GPU nodes: the (CPU) orchestrator and env workers get
    only their own."""
    sched = spec.scheduling
    gpu = component in GPU_COMPONENTS
    defaults = PodSettings(
        node_selector=sched.node_selector if gpu else {},
        tolerations=sched.tolerations if gpu else [],
        priority_class_name=sched.priority_class_name,
        scheduler_name=sched.scheduler_name,
        service_account_name=spec.service_account_name,
    )
    return merge_pod_settings(defaults, getattr(spec, SPEC_SECTION.get(component, component)).pod)


def merge_pod_settings(base: PodSettings, own: PodSettings) -> PodSettings:
    """Maps merge (`own` wins), lists are appended after `base`'s, a scalar set in `own` wins."""
    merged = {}
    for name in PodSettings.model_fields:
        a, b = getattr(base, name), getattr(own, name)
        if isinstance(a, dict) and isinstance(b, dict):
            merged[name] = a | b
        elif isinstance(a, list):
            merged[name] = a + b
        else:
            merged[name] = a if b is None else b
    return PodSettings.model_construct(**merged)


def resources(res: Resources, gpus: int) -> dict:
    """Requests/limits as given; GPUs are set on both (Kubernetes requires requests == limits)."""
    requests = {k: str(v) for k, v in res.requests.items()}
    limits = {k: str(v) for k, v in res.limits.items()}
    if gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(gpus)
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def volumes(run: RunRef, spec: RunSpecBase, config_files: list[str]) -> list[dict]:
    """The operator's own volumes (`names.OPERATOR_VOLUMES`)."""
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


def volume_mounts(spec: RunSpecBase, component: str, writable: list[str]) -> list[dict]:
    """The run's claim is read-write in the trainer's pods alone: the trainer loads its
    checkpoints and compile cache from it, and the orchestrator's, env workers' and servers'
    pods run code (an environment's programs) or serve a network, so they read it only (a
    model kept there, the trainer's markers and weights). `writable`: the directories under the
    claim a component writes (the orchestrator's own), mounted read-write over it by `subPath`.
    An emptyDir is the pod's own: writable."""
    pvc = spec.storage.pvc
    data_path = pvc.mount_path if pvc else EMPTYDIR_OUTPUT
    data = [{"name": "data", "mountPath": data_path}]
    if pvc is not None and component != "trainer":
        data = [data[0] | {"readOnly": True}]
        data += [{"name": "data", "mountPath": f"{data_path.rstrip('/')}/{d}", "subPath": d} for d in writable]
    return [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        *data,
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "tmp", "mountPath": "/tmp"},
    ]


def container(
    spec: RunSpecBase,
    settings: PodSettings,
    name: str,
    command: list[str],
    *,
    ports: list[dict],
    res: Resources,
    gpus: int = 0,
    env: list[dict] | None = None,
    probes: dict | None = None,
    writable: list[str] = (),
) -> dict:
    """The component's container: the operator's env, envFrom and mounts, then the user's.
    `writable`: the directories of the run's claim it writes besides the trainer (`volume_mounts`)."""
    store = spec.storage.object_store
    # The root filesystem is read-only: caches under $HOME (Hugging Face, vLLM, Triton) go to /tmp.
    env = list(env or []) + [{"name": "PYTHONUNBUFFERED", "value": "1"}, {"name": "HOME", "value": "/tmp"}]
    if store and store.endpoint_url:
        env.append({"name": "AWS_ENDPOINT_URL", "value": store.endpoint_url})
    env += [e.model_dump(by_alias=True, exclude_none=True) for e in settings.env]
    # Credentials stay in the user's Secret; the pod reads them, the operator never does.
    secret = store_secret(spec, name)
    env_from = [{"secretRef": {"name": secret}}] if secret else []
    env_from += settings.env_from
    out = {
        "name": name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": command,
        "ports": ports,
        "env": env,
        "resources": resources(res, gpus),
        "volumeMounts": volume_mounts(spec, name, list(writable)) + settings.volume_mounts,
        # The runtime writes its error (naming the field) to /dev/termination-log; a crash that
        # wrote none leaves its log's tail: either way the operator can say why the pod failed.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security(),
        **(probes or {}),
    }
    if env_from:
        out["envFrom"] = env_from
    return out


STORE_WRITERS = ("trainer", "orchestrator", "export")
STORE_READERS = ("inference",)
"""Who gets the object store's credentials: the trainer (weights, checkpoints, compile cache),
the orchestrator (its checkpoints) and the export Job (it reads the checkpoints and writes
`spec.export.url`) write; inference reads weight snapshots when they go through the store. Env
workers (user environment code), the teacher and the judge get none."""


def store_secret(spec: RunSpecBase, component: str) -> str | None:
    """The Secret with the object store's credentials that `component` gets, if any."""
    store = spec.storage.object_store
    if store is None or component not in STORE_WRITERS + STORE_READERS:
        return None
    if component in STORE_WRITERS:
        return store.secret_name
    weights = spec.config.weights
    if weights.type != "storage" or (weights.url is not None and "://" not in weights.url):
        return None  # weights reach inference by gRPC/NCCL, or on the shared volume
    return store.read_only_secret_name or store.secret_name


def container_security() -> dict:
    """What the `restricted` Pod Security Standard asks of each container, and a read-only root
    filesystem: the runtime writes only to its volumes (/tmp, the run's data, /dev/shm)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


def pod_template(run: RunRef, spec: RunSpecBase, settings: PodSettings, component: str, containers: list[dict],
                 config_files: list[str], annotations: dict[str, str] | None = None, **extra) -> dict:
    """A component's pod template: the operator's labels and annotations, then the user's
    (which may not reuse the operator's keys: `PodSettings` refuses them)."""
    group_labels, group_annotations = gang.pod_marks(run, settings.scheduler_name)
    metadata = {"labels": run.labels(component) | group_labels | settings.labels}
    if annotations := (annotations or {}) | group_annotations | settings.annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec(run, spec, settings, component, containers, config_files,
                                                        **extra)}


def pod_spec(run: RunRef, spec: RunSpecBase, settings: PodSettings, component: str, containers: list[dict],
             config_files: list[str], **extra) -> dict:
    out = {
        "containers": [c | {"env": [*credentials_env(run, component), *c.get("env", [])]} for c in containers],
        "volumes": volumes(run, spec, config_files) + settings.volumes,
        "enableServiceLinks": False,
        # The runtime never talks to the Kubernetes API.
        "automountServiceAccountToken": False,
        "securityContext": spec.security_context.model_dump(by_alias=True, exclude_none=True),
        **extra,
    }
    optional = {
        "nodeSelector": settings.node_selector or None,
        "tolerations": [t.model_dump(by_alias=True, exclude_none=True) for t in settings.tolerations] or None,
        "affinity": settings.affinity,
        "topologySpreadConstraints": settings.topology_spread_constraints or None,
        "priorityClassName": settings.priority_class_name,
        "schedulerName": settings.scheduler_name,
        "runtimeClassName": settings.runtime_class_name,
        "serviceAccountName": settings.service_account_name,
        "imagePullSecrets": [{"name": s} for s in spec.image_pull_secrets] or None,
    }
    out.update({k: v for k, v in optional.items() if v is not None})
    return out


def credentials_env(run: RunRef, component: str) -> list[dict]:
    """The run's credentials `component` holds (`rlkube.scopes.HELD`), from the run's Secret:
    each pod-to-pod call carries the one its route needs, and each server accepts only those
    it holds."""
    return [{"name": scope_env(scope), "valueFrom": {"secretKeyRef": {"name": run.child("token"), "key": scope}}}
            for scope in HELD[component]]


def http_probes(path: str, port: str, startup_timeout_s: float) -> dict:
    """Startup probe allows the whole startup timeout (model load), then liveness/readiness."""
    get = {"httpGet": {"path": path, "port": port}}
    return {
        "startupProbe": {**get, "periodSeconds": 10, "failureThreshold": max(1, int(startup_timeout_s // 10))},
        "readinessProbe": {**get, "periodSeconds": 5, "failureThreshold": 3},
        "livenessProbe": {**get, "periodSeconds": 15, "failureThreshold": 4},
    }
