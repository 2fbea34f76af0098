"""The RLRun and SFTRun resources as pydantic models: the CRD schemas are generated from these.

`spec.config` embeds the runtime's own config model (`RLConfig` / `SFTConfig`, the same structure
as the TOML); everything else here is what only Kubernetes needs: image, replicas, GPUs,
resources, storage, suspend, restart policy and scheduling. Kubernetes-facing fields are
camelCase, the embedded config keeps the TOML's snake_case.

Where pydantic cannot say it in JSON schema, `x-kubernetes-validations` (CEL) rules in
`json_schema_extra` make the API server refuse the object with a field-level message.
"""

import copy
import json
from datetime import datetime
from typing import Annotated, ClassVar, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel
from rlkube.config import (
    Config,
    InferenceServerConfig,
    ModelConfig,
    OrchestratorSection,
    RLConfig,
    SFTConfig,
)

from rlkube_operator.names import OPERATOR_ENV, OPERATOR_VOLUMES, RESERVED_PREFIX, operator_label


class K8sModel(Config):
    """camelCase field names, as Kubernetes users expect; snake_case still accepted in Python."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


def _cel(*rules: tuple[str, str]) -> dict:
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


# Kubernetes' resource.Quantity (the pattern its own CRD generators emit): a malformed one is
# refused at admission, not when the operator creates the pods.
Quantity = int | Annotated[str, Field(pattern=(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
))]


class Resources(K8sModel):
    """Container resources as Kubernetes quantities (`cpu: "4"`, `memory: 16Gi`).
    GPUs come from the `gpus*` fields, not from here."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Requested resources (what the scheduler reserves)."""

    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Resource limits."""


class Toleration(K8sModel):
    """A Kubernetes toleration."""

    key: str | None = None
    """Taint key; empty with `Exists` tolerates everything."""

    operator: Literal["Exists", "Equal"] | None = None
    """`Equal` (default) or `Exists`."""

    value: str | None = None
    """Taint value for `Equal`."""

    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect; all when unset."""

    toleration_seconds: int | None = None
    """For `NoExecute`: how long the pod stays bound after the taint appears."""


class SchedulingSpec(K8sModel):
    """Run-level scheduling. `nodeSelector` and `tolerations` are meant for the GPU nodes: they
    go to the inference and trainer pods, not to the (CPU) orchestrator, which gets only what
    `orchestrator.pod` sets. `priorityClassName` and `schedulerName` go to every pod."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels the pods require."""

    tolerations: list[Toleration] = Field(default_factory=list)
    """Taints the pods tolerate."""

    priority_class_name: str | None = None
    """Pod priority class."""

    scheduler_name: str | None = None
    """The scheduler of the pods instead of the default one (for example `volcano`). Kueue is a
    queue, not a scheduler: use `spec.queue` for it."""


class EnvVar(K8sModel):
    """An environment variable of the component's container (Kubernetes' EnvVar)."""

    name: str = Field(min_length=1)
    """Variable name; not one the operator sets (`PYTHONUNBUFFERED`, `HOME`, `AWS_ENDPOINT_URL`,
    `NODE_RANK`, `MASTER_ADDR`)."""

    value: str | None = None
    """Its value."""

    value_from: dict | None = None
    """A Kubernetes EnvVarSource (`secretKeyRef`, `configMapKeyRef`, `fieldRef`, …)."""


class PodSettings(SchedulingSpec):
    """One component's pods, on top of the run-level `scheduling` and `serviceAccountName`:
    maps (nodeSelector, labels, annotations) merge with this section winning, lists
    (tolerations, env, volumes, …) are appended after the run-level ones, and a scalar set here
    replaces the run-level one. What the operator itself sets cannot be overridden: its env
    variables, its `rlkube.dev/*` and `app.kubernetes.io/*` labels, `rlkube.dev/*` annotations
    and its volumes (`config`, `data`, `dshm`, `tmp`)."""

    affinity: dict | None = None
    """A Kubernetes Affinity (nodeAffinity, podAffinity, podAntiAffinity)."""

    topology_spread_constraints: list[dict] = Field(default_factory=list)
    """Kubernetes TopologySpreadConstraints."""

    runtime_class_name: str | None = None
    """RuntimeClass of the pods (for example `nvidia`)."""

    service_account_name: str | None = None
    """ServiceAccount of these pods; the run-level `serviceAccountName` when unset."""

    env: list[EnvVar] = Field(default_factory=list)
    """Environment variables of the container, after the operator's own."""

    env_from: list[dict] = Field(default_factory=list)
    """Kubernetes EnvFromSources (`secretRef`, `configMapRef`), after the object store's Secret."""

    volumes: list[dict] = Field(default_factory=list)
    """Extra Kubernetes Volumes of the pods, each with a `name` of its own."""

    volume_mounts: list[dict] = Field(default_factory=list)
    """Extra Kubernetes VolumeMounts of the container."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Extra pod labels."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra pod annotations."""

    @model_validator(mode="after")
    def _nothing_the_operator_sets(self):
        """Overriding these would break the operator's own wiring (selectors, the attempt it
        reads back, torchrun's rendezvous, the config and data volumes), so they are refused."""
        problems = [f"env[{i}].name {e.name!r} is set by the operator"
                    for i, e in enumerate(self.env) if e.name in OPERATOR_ENV]
        problems += [f"labels {key!r} is the operator's label" for key in self.labels if operator_label(key)]
        problems += [f"annotations {key!r}: {RESERVED_PREFIX}* annotations are the operator's"
                     for key in self.annotations if key.startswith(RESERVED_PREFIX)]
        for i, volume in enumerate(self.volumes):
            if not isinstance(volume.get("name"), str):
                problems.append(f"volumes[{i}] needs a name")
            elif volume["name"] in OPERATOR_VOLUMES:
                problems.append(f"volumes[{i}].name {volume['name']!r} is the operator's volume")
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ServersSpec(K8sModel):
    """vLLM servers: a StatefulSet with a headless Service, one pod per replica."""

    replicas: int = Field(default=1, ge=1, le=64)
    """Data-parallel servers (one pod each)."""

    gpus_per_replica: int = Field(default=0, ge=0, le=16)
    """`nvidia.com/gpu` per server pod; 0 runs vLLM on CPUs (the `vllm-cpu` image). vLLM shards
    the model over the pod's GPUs (its `tensor_parallel_size`)."""

    resources: Resources = Resources()
    """CPU and memory of each server pod."""

    pod: PodSettings = PodSettings()
    """Scheduling, env, volumes, labels and annotations of each server pod, over the run-level
    defaults (the GPU nodes' nodeSelector and tolerations included)."""


class InferenceSpec(ServersSpec):
    """The vLLM inference servers of the policy: a StatefulSet with a headless Service."""

    replicas: int = Field(default=1, ge=1, le=64)
    """Data-parallel inference servers (one pod each). Sets `config.inference.replicas`."""


class TeacherModelConfig(ModelConfig):
    """The teacher's weights, given as `config.model` gives the policy's."""

    name: str = Field(min_length=1)
    """A Hugging Face hub id, or a model directory on the run's volume (for example an SFTRun's
    export, `<mountPath>/<sft run>/weights/final`). Also the model name of the orchestrator's
    requests to the teacher (`config.orchestrator.teacher.model`)."""


class TeacherSpec(ServersSpec):
    """The teacher of on-policy distillation: vLLM servers `<run>-teacher` (a StatefulSet with a
    headless Service) that score the student's sampled tokens with the teacher's log-probs. The
    operator points `config.orchestrator.teacher` at them (its `base_urls` and `model`); the
    loss that uses them is the trainer's (`config.trainer.loss`). A teacher's weights never
    change: it gets no weight updates and starts serving at once (not paused)."""

    model: TeacherModelConfig
    """The teacher model."""

    server: InferenceServerConfig = InferenceServerConfig()
    """The teacher's vLLM server, as `config.inference` sets the policy's (context length,
    memory, prefix caching, `extra_args`, startup timeout). The operator sets `host` and
    `tensor_parallel_size` (from `gpusPerReplica`)."""


class OrchestratorSpec(K8sModel):
    """The orchestrator: a one-replica Deployment (Recreate) with a Service for gRPC and metrics."""

    resources: Resources = Resources()
    """CPU and memory of the orchestrator pod."""

    pod: PodSettings = PodSettings()
    """Scheduling, env, volumes, labels and annotations of the orchestrator pod, over the run-level
    defaults."""


class EnvWorkersSpec(K8sModel):
    """Env workers: a Deployment `<run>-env-worker` of `rlkube env-worker` pods that run the
    rollouts, dialing the orchestrator's gRPC Service, while the orchestrator keeps the policy
    clock, buffer, advantages and packing (`config.orchestrator.env_workers`). CPU only."""

    replicas: int = Field(default=0, ge=0, le=256)
    """Env worker pods. 0 (the default) runs the rollouts in the orchestrator's own process and
    creates no Deployment. Sets `config.orchestrator.env_workers`."""

    resources: Resources = Resources()
    """CPU and memory of each env worker pod."""

    pod: PodSettings = PodSettings()
    """Scheduling, env, volumes, labels and annotations of each env worker pod, over the
    run-level defaults (as for the orchestrator: not the run-level nodeSelector and
    tolerations, which are the GPU nodes')."""


class TrainerSpec(K8sModel):
    """The trainer: an indexed Job of `nodes` pods running `torchrun`, with a headless Service."""

    nodes: int = Field(default=1, ge=1, le=256)
    """Trainer pods (torchrun nodes); node rank = the Job completion index."""

    gpus_per_node: int = Field(default=0, ge=0, le=16)
    """`nvidia.com/gpu` per trainer pod; torchrun starts one process per GPU."""

    procs_per_node: int = Field(default=1, ge=1, le=64)
    """torchrun processes per pod when `gpusPerNode` is 0 (CPU training with gloo)."""

    resources: Resources = Resources()
    """CPU and memory of each trainer pod."""

    pod: PodSettings = PodSettings()
    """Scheduling, env, volumes, labels and annotations of each trainer pod, over the run-level
    defaults."""

    def nproc_per_node(self) -> int:
        return self.gpus_per_node or self.procs_per_node


class PVCStorage(K8sModel):
    """A PersistentVolumeClaim holding the output directory (checkpoints, weights, logs)."""

    claim_name: str | None = Field(default=None, max_length=253)
    """Use this existing claim (it outlives the run). Unset: the operator creates `<run>-data`,
    owned by the run."""

    size: str = Field(default="20Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")
    """Size of the claim the operator creates."""

    storage_class_name: str | None = None
    """Storage class of the claim the operator creates; the cluster default when unset."""

    access_modes: list[Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"]] = Field(
        default=["ReadWriteOnce"], min_length=1
    )
    """Access modes of the claim the operator creates. Every pod of the run mounts it, so pods
    on several nodes share it only with ReadWriteMany: a trainer of more than one node needs
    it. With ReadWriteOnce every pod must land on one node (a pod elsewhere waits with a
    Multi-Attach error, shown in its component's condition)."""

    mount_path: str = Field(default="/data", pattern=r"^/")
    """Where pods mount the claim; the run's output directory is `<mountPath>/<run name>`."""


CREDENTIAL_QUERY_KEYS = ("key", "secret", "token", "password", "passwd", "credential", "signature", "sig")
"""Query parameters that carry credentials (`?access_key=`, `?X-Amz-Signature=`, `?sig=`)."""


URL_CREDENTIALS_RE = (r"^[a-z][a-z0-9+.-]*://[^/?#]*@|[?&][^=&#]*(?i:"
                      + "|".join(CREDENTIAL_QUERY_KEYS) + ")")
"""`url_credentials` as the CRD's CEL rule sees it (RE2)."""


def url_credentials(url: str) -> str | None:
    """What in `url` is a credential (user info, or a query parameter named like one), or None.
    URLs land in the run's ConfigMap and the pods' command lines, readable by anyone who may
    read those: credentials belong in a Secret."""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        return "user info before '@'"
    names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    if found := [n for n in names if any(word in n.lower() for word in CREDENTIAL_QUERY_KEYS)]:
        return f"query parameter {found[0]!r}"
    return None


def _urls(node, path: str):
    """(path, value) of every string under a key that names a URL (`url`, `*_url`, `*_urls`)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith(("url", "urls")) and isinstance(value, str):
                yield f"{path}.{key}", value
            elif key.endswith("urls") and isinstance(value, list):
                yield from ((f"{path}.{key}[{i}]", v) for i, v in enumerate(value) if isinstance(v, str))
            else:
                yield from _urls(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _urls(value, f"{path}[{i}]")


class ObjectStoreStorage(K8sModel):
    """An object store (an fsspec URL such as `s3://bucket/prefix`) for weight snapshots and
    checkpoints."""

    model_config = ConfigDict(json_schema_extra=_cel(*(
        (f"!has(self.{field}) || !self.{field}.matches('{URL_CREDENTIALS_RE}')",
         (f"storage.objectStore.{field} must not hold credentials (user info before '@', or a key,"
          " secret, token, password or signature query parameter): put them in the Secret named by secretName"))
        for field in ("url", "endpointUrl")
    )))

    url: str = Field(pattern=r"^[a-z][a-z0-9+.-]*://.+")
    """Base URL; weights go to `<url>/<namespace>/<run>/weights`, checkpoints to
    `<url>/<namespace>/<run>/checkpoints` (unless `config.weights.url` / `config.ckpt.url` are set).
    No credentials in it (`s3://KEY:SECRET@bucket` is refused): they go in `secretName`."""

    secret_name: str | None = None
    """A Secret whose keys become environment variables of the pods that write the store (for
    example `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`): the trainer and the orchestrator, and
    the inference servers when weights go through the store (`readOnlySecretName` for them
    instead, if set). Env workers and the teacher never get it. The operator never reads it."""

    read_only_secret_name: str | None = None
    """A Secret with read-only credentials for the inference servers, which only download
    weight snapshots; unset, they get `secretName`'s."""

    endpoint_url: str | None = None
    """S3-compatible endpoint (MinIO, Ceph), passed as `AWS_ENDPOINT_URL`; no credentials in it."""

    @model_validator(mode="after")
    def _no_credentials_in_urls(self):
        """Checked on the whole section, so that the error does not echo the URL's secret."""
        for field in ("url", "endpoint_url"):
            if (url := getattr(self, field)) is not None and (found := url_credentials(url)):
                raise ValueError(f"{to_camel(field)} holds a credential ({found}); put credentials in "
                                 "the Secret named by secretName, never in a URL")
        return self


class StorageSpec(K8sModel):
    """Where the run's files live. Without a PVC, output goes to an emptyDir and is lost with
    the pod: restarts then start from scratch."""

    pvc: PVCStorage | None = None
    """Output directory (checkpoints, weights, logs) on a PersistentVolumeClaim."""

    object_store: ObjectStoreStorage | None = None
    """Weight snapshots and checkpoints in an object store, so the pods need no shared filesystem."""


class QueueSpec(K8sModel):
    """A Kueue LocalQueue: the run is admitted, evicted and finished as one Kueue Workload."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """The LocalQueue in the run's namespace (what `kueue.x-k8s.io/queue-name` names)."""

    priority_class_name: str | None = None
    """A Kueue WorkloadPriorityClass: the Workload's priority in its ClusterQueue."""


class RestartPolicy(K8sModel):
    backoff_limit: int = Field(default=3, ge=0, le=100)
    """Gang restarts of the trainer (from the latest checkpoint) before the run is Failed."""


class SeccompProfile(K8sModel):
    type: Literal["RuntimeDefault", "Unconfined"] = "RuntimeDefault"
    """`RuntimeDefault`: the container runtime's default profile (the restricted Pod Security
    Standard requires it)."""


IMAGE_UID = 1000
"""The user (and group) the rlkube runtime images run as (images/runtime-*.Dockerfile)."""


class PodSecurityContext(K8sModel):
    """The security context of every pod of the run (Kubernetes' PodSecurityContext, in part).
    The defaults meet the `restricted` Pod Security Standard and match the rlkube runtime
    images (uid and gid 1000). Whatever is set here, every container also runs with
    `allowPrivilegeEscalation: false`, every capability dropped, a read-only root filesystem
    (writable: `/tmp`, the run's volume, `/dev/shm`) and no service-account token. The chart's
    guardrails refuse root (`runAsUser: 0`, `runAsNonRoot: false`) and `Unconfined` unless the
    cluster admin allows them."""

    model_config = ConfigDict(json_schema_extra=_cel((
        "!has(self.runAsNonRoot) || !self.runAsNonRoot || !has(self.runAsUser) || self.runAsUser != 0",
        "securityContext.runAsUser 0 is root, and runAsNonRoot is true: no container could start",
    )))

    run_as_non_root: bool = True
    """Refuse to start a container whose user is root."""

    run_as_user: int = Field(default=IMAGE_UID, ge=0)
    """User id of the processes."""

    run_as_group: int = Field(default=IMAGE_UID, ge=0)
    """Primary group id of the processes."""

    fs_group: int | None = Field(default=IMAGE_UID, ge=0)
    """Group that owns the pods' volumes (Kubernetes makes them group-writable for it), so the
    pods can write checkpoints on storage classes that create root-owned volumes."""

    seccomp_profile: SeccompProfile = SeccompProfile()
    """Seccomp profile of every container."""

    @model_validator(mode="after")
    def _startable(self):
        """The kubelet refuses to start such a container (CreateContainerConfigError): say so now."""
        if self.run_as_non_root and self.run_as_user == 0:
            raise ValueError("runAsUser 0 is root, and runAsNonRoot is true: no container could start; "
                             "set runAsNonRoot to false (if the cluster admin allows root) or a non-zero runAsUser")
        return self


PVC_NODES_RULE = (
    (
        "!has(self.storage.pvc) || has(self.storage.pvc.claimName) || self.trainer.nodes <= 1"
        " || 'ReadWriteMany' in self.storage.pvc.accessModes"
    ),
    (
        "storage.pvc.accessModes must include ReadWriteMany when trainer.nodes > 1: every trainer"
        " pod mounts the claim from its own node"
    ),
)


def _one_pod_claim_rule(unless: str = "") -> tuple[str, str]:
    """ReadWriteOncePod refused for a claim the operator creates, `unless` the run has one pod."""
    rule = ("!has(self.storage.pvc) || has(self.storage.pvc.claimName)"
            f" || self.storage.pvc.accessModes != ['ReadWriteOncePod']{unless}")
    message = ("storage.pvc.accessModes ['ReadWriteOncePod'] lets one pod use the claim, and every pod"
               " of the run mounts it: use ReadWriteOnce or ReadWriteMany")
    return rule, message


def _or_default(model: type[BaseModel], field: str) -> str:
    """A config field in CEL, or the runtime's default where the user left it out: the CRD
    carries no defaults inside `spec.config` (the stored object says only what the user wrote)."""
    return f"(has(self.{field}) ? self.{field} : {json.dumps(model.model_fields[field].default)})"


def _config_rule(rule: str, message: str, field: str) -> dict:
    """A CEL rule on a node inside `spec.config`; the API server's error names `field`."""
    return {"message": message, "rule": rule, "fieldPath": f".{field}"}


class RunSpecBase(K8sModel):
    """What RLRun and SFTRun share."""

    image: str = Field(min_length=1)
    """The rlkube runtime image (`rlkube-runtime-cpu` or `rlkube-runtime-gpu`)."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy of every container."""

    image_pull_secrets: list[str] = Field(default_factory=list)
    """Names of Secrets for pulling the image."""

    service_account_name: str | None = None
    """ServiceAccount of the run's pods (for example one with object-store access)."""

    trainer: TrainerSpec = TrainerSpec()
    """The trainer pods."""

    storage: StorageSpec = StorageSpec()
    """Checkpoints and weights."""

    suspend: bool = False
    """True scales every compute child to zero and keeps storage; false again resumes from the
    latest checkpoint."""

    restart_policy: RestartPolicy = RestartPolicy()
    """What happens when a trainer pod fails."""

    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """The longest the whole run may take, in seconds of wall time from `status.startTime` (its
    first start; a run created suspended, waiting in a queue, starts its clock when released;
    time suspended after that counts). Past it the run is Failed with reason
    `DeadlineExceeded`: inference, the orchestrator and the env workers are deleted, and the
    trainer stops, since
    each trainer Job is created with the time left as its own `activeDeadlineSeconds` (so
    Kubernetes stops it even while the operator is down). Checkpoints stay. Unset: no limit.
    Fixed once the run has started."""

    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Seconds after the run finished (Succeeded or Failed: `status.completionTime`) when the
    operator deletes the run itself, and with it every child: the trainer Job and its logs, the
    ConfigMap, and a PVC the operator created (a `storage.pvc.claimName` claim and object-store
    data stay). 0 deletes it as soon as it finishes; unset keeps it until deleted. Like a Job's
    `ttlSecondsAfterFinished`, but for the whole run. Applies live, also to a finished run."""

    scheduling: SchedulingSpec = SchedulingSpec()
    """Scheduling knobs for every pod."""

    queue: QueueSpec | None = None
    """Queue the run in Kueue: until its Workload is admitted the run has no pods (phase
    Pending, reason `Queued`) and its `activeDeadlineSeconds` does not run; evicted, it scales
    to zero without spending `backoffLimit` and resumes from the latest checkpoint when
    admitted again. Unset: the run starts at once."""

    security_context: PodSecurityContext = PodSecurityContext()
    """Security context of every pod; the `restricted` Pod Security Standard by default."""

    @field_validator("security_context", mode="before")
    @classmethod
    def _restricted_when_null(cls, value):
        """A spec stored before the restricted defaults (`securityContext: null`) gets them."""
        return PodSecurityContext() if value is None else value

    @model_validator(mode="after")
    def _no_credentials_in_config_urls(self):
        """The config becomes the run's ConfigMap: a URL in it (`ckpt.url`, `weights.url`, …)
        must not carry credentials either (the error does not echo them)."""
        for path, url in _urls(self.config.model_dump(exclude_unset=True), "config"):
            if found := url_credentials(url):
                raise ValueError(f"{path} holds a credential ({found}); put credentials in the Secret named "
                                 "by storage.objectStore.secretName, never in a URL")
        return self

    @model_validator(mode="after")
    def _storage_reaches_every_pod(self):
        """Every pod of the run mounts the claim: one the operator creates must allow that."""
        pvc = self.storage.pvc
        if pvc is not None and not pvc.claim_name and "ReadWriteMany" not in pvc.access_modes:
            if self.trainer.nodes > 1:
                raise ValueError(
                    f"storage.pvc.accessModes {pvc.access_modes}: trainer.nodes is {self.trainer.nodes}, "
                    "and every trainer pod mounts the claim, from its own node: that needs ReadWriteMany "
                    "(ReadWriteOnce attaches to one node only)"
                )
            if pvc.access_modes == ["ReadWriteOncePod"] and self._pods() > 1:
                raise ValueError(
                    f"storage.pvc.accessModes ['ReadWriteOncePod'] lets one pod use the claim, and all "
                    f"{self._pods()} pods of the run mount it: use ReadWriteOnce or ReadWriteMany"
                )
        ckpt = getattr(self.config, "ckpt", None)
        if ckpt is not None and isinstance(ckpt.resume_step, int):
            raise ValueError(
                "config.ckpt.resume_step: on Kubernetes every start resumes from the newest complete "
                "checkpoint ('latest'), or starts fresh when there is none; leave it unset"
            )
        return self

    def _pods(self) -> int:
        return self.trainer.nodes


TEACHER_CONFIG_PATH = ("config", "orchestrator", "teacher")
"""Where the runtime config names the teacher the orchestrator asks."""


def _get(obj, key: str):
    """A key of a raw dict, or a field of a model, or None."""
    return obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)


class RLRunSpec(RunSpecBase):
    """An asynchronous RL run: inference servers, an orchestrator and a trainer."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            PVC_NODES_RULE,
            _one_pod_claim_rule(),  # inference, orchestrator and trainer: 3 pods at least
            (
                (
                    "!has(self.config) || !has(self.config.inference)"
                    " || !has(self.config.inference.replicas)"
                    " || self.config.inference.replicas == self.inference.replicas"
                ),
                "config.inference.replicas must equal inference.replicas (or be left out)",
            ),
            (
                (
                    "!has(self.config) || !has(self.config.orchestrator)"
                    " || !has(self.config.orchestrator.env_workers)"
                    " || self.config.orchestrator.env_workers == self.envWorkers.replicas"
                ),
                "config.orchestrator.env_workers must equal envWorkers.replicas (or be left out)",
            ),
            (
                "!has(self.config) || !has(self.config.teacher)",
                "config.teacher is the teacher server `rlkube rl` starts on one machine; in an RLRun use spec.teacher (the operator runs its servers)",
            ),
            (
                (
                    "(has(self.config) && has(self.config.weights) && has(self.config.weights.type)"
                    " && self.config.weights.type != 'storage')"
                    " || has(self.storage.pvc) || has(self.storage.objectStore)"
                ),
                (
                    "config.weights.type 'storage' (the default) needs storage.pvc or"
                    " storage.objectStore; or set config.weights.type to 'grpc'"
                ),
            ),
        )
    )

    CONFIG_RULES: ClassVar[dict[tuple[str, ...], list[dict]]] = {
        # What the runtime's validators check across fields, checked at admission too. Each
        # rule sits on its own node of `spec.config`, so it runs only when the user set it.
        ("orchestrator",): [
            _config_rule(
                f"{_or_default(OrchestratorSection, 'batch_size')} % {_or_default(OrchestratorSection, 'group_size')}"
                " == 0",
                "batch_size must be a multiple of group_size: a batch is whole groups of rollouts"
                f" (defaults {OrchestratorSection.model_fields['batch_size'].default} and"
                f" {OrchestratorSection.model_fields['group_size'].default})",
                "batch_size",
            ),
        ],
        ("orchestrator", "sampling"): [
            _config_rule(
                # double(): a `number` written as an integer (`temperature: 0`) compares as one.
                "!has(self.temperature) || double(self.temperature) > 0.0",
                "temperature must be > 0 for training: the trainer divides the logits by it to"
                " recompute the sampled tokens' log-probs (greedy decoding is for eval.sampling)",
                "temperature",
            ),
            _config_rule(
                "!has(self.top_p) || double(self.top_p) == 1.0",
                "top_p must be 1 for training: vLLM's log-probs would come from the truncated"
                " distribution and the trainer's from the full one (eval.sampling may use top_p)",
                "top_p",
            ),
        ],
    }
    """CEL rules inside `spec.config`, by path (the CRD generator places them)."""

    config: RLConfig = RLConfig()
    """The runtime config, as in `rl.toml`. The operator sets what the cluster decides:
    inference URLs, service addresses, output directory, replicas."""

    inference: InferenceSpec = InferenceSpec()
    """The inference servers."""

    orchestrator: OrchestratorSpec = OrchestratorSpec()
    """The orchestrator."""

    env_workers: EnvWorkersSpec = EnvWorkersSpec()
    """Env workers that run the rollouts beside the orchestrator; none by default."""

    teacher: TeacherSpec | None = None
    """A teacher for on-policy distillation; none by default. A suspended run may add, change or
    drop it: the teacher keeps nothing of the run."""

    def _pods(self) -> int:
        teachers = self.teacher.replicas if self.teacher else 0
        return self.trainer.nodes + self.inference.replicas + 1 + self.env_workers.replicas + teachers

    @model_validator(mode="wrap")
    @classmethod
    def _config_knows_its_teacher(cls, data, handler):
        """`config.orchestrator.teacher.model` is `teacher.model.name` (and the operator points its
        `base_urls` at the teacher's servers). The runtime config refuses a distilling loss
        without a teacher, so its checks are given the model; but that is the operator's, not the
        user's: it stays out of the set fields (the spec the ConfigMap stores, the TOML), so the
        teacher may still change while the run is suspended."""
        name = _get(_get(_get(data, "teacher"), "model"), "name")
        if not isinstance(data, dict) or name is None:
            return handler(data)
        data, created = copy.deepcopy(data), []
        given = data
        for key in TEACHER_CONFIG_PATH:
            if key not in given:
                created.append(key)
            given = given.setdefault(key, {})
        if given.get("model", name) != name:
            raise ValueError(f"config.orchestrator.teacher.model ({given['model']!r}) must equal "
                             f"teacher.model.name ({name!r}) or be left out")
        if "base_urls" in given:
            raise ValueError("config.orchestrator.teacher.base_urls: the operator points them at the teacher's "
                             "servers; leave them out (or drop spec.teacher to use servers of your own)")
        user_set = "model" in given
        given["model"] = name
        spec = handler(data)
        holders = (spec, spec.config, spec.config.orchestrator)
        for holder, key in zip(holders, TEACHER_CONFIG_PATH, strict=True):
            if key in created:
                holder.model_fields_set.discard(key)
        if not user_set:
            spec.config.orchestrator.teacher.model_fields_set.discard("model")
        return spec

    @model_validator(mode="after")
    def _consistent(self):
        cfg = self.config.inference
        if "replicas" in cfg.model_fields_set and cfg.replicas != self.inference.replicas:
            raise ValueError(
                f"config.inference.replicas ({cfg.replicas}) must equal inference.replicas "
                f"({self.inference.replicas}) or be left out"
            )
        if self.config.teacher is not None:
            raise ValueError("config.teacher is the teacher server `rlkube rl` starts on one machine; in an RLRun use spec.teacher (the operator runs its servers)")
        workers = self.config.orchestrator
        if "env_workers" in workers.model_fields_set and workers.env_workers != self.env_workers.replicas:
            raise ValueError(
                f"config.orchestrator.env_workers ({workers.env_workers}) must equal envWorkers.replicas "
                f"({self.env_workers.replicas}) or be left out"
            )
        if self.config.weights.type == "storage" and not (self.storage.pvc or self.storage.object_store):
            raise ValueError(
                "config.weights.type 'storage' needs storage.pvc or storage.objectStore "
                "(or use weights.type 'grpc')"
            )
        return self


class SFTRunSpec(RunSpecBase):
    """Supervised fine-tuning: the trainer alone."""

    model_config = ConfigDict(
        json_schema_extra=_cel(PVC_NODES_RULE, _one_pod_claim_rule(" || self.trainer.nodes <= 1"))
    )

    config: SFTConfig = SFTConfig()
    """The runtime config, as in `sft.toml`. The operator sets the output directory."""


Phase = Literal["Pending", "Initializing", "Running", "Succeeded", "Failed", "Suspended"]


class Condition(K8sModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str
    """Ready, Progressing, Reconciling, Stalled, Degraded, SpecAccepted, InferenceReady,
    OrchestratorReady, TrainerReady, TeacherReady (a run with a teacher)."""

    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""

    reason: str
    """CamelCase reason (for example CrashLoopBackOff, Unschedulable, FailedAttachVolume,
    ReconcileError, PreviousRunTerminating)."""

    message: str = ""
    """Human-readable details."""

    last_transition_time: datetime
    """When the status last changed."""

    observed_generation: int | None = None
    """The `metadata.generation` this condition was computed for."""


class InferenceStatus(K8sModel):
    """The RLRun's inference replicas, as its scale subresource reports them (so `kubectl
    scale`, an HPA or KEDA can drive `spec.inference.replicas`)."""

    replicas: int = 0
    """Inference pods that exist now (the scale subresource's `status.replicas`)."""

    ready_replicas: int = 0
    """Of them, the Ready ones."""

    ready: str | None = None
    """`ready/desired` (printer column `Inference`)."""

    selector: str | None = None
    """The label selector of the run's inference pods, serialized (the scale subresource's
    `status.selector`, which an HPA reads to find the pods' metrics)."""


class RunStatus(K8sModel):
    """What the operator observed; written only by the operator (status subresource)."""

    phase: Phase | None = None
    """Pending, Initializing, Running, Succeeded, Failed or Suspended."""

    message: str | None = None
    """Why the run is in this phase."""

    observed_generation: int | None = None
    """The `metadata.generation` the operator last reconciled."""

    conditions: list[Condition] = Field(default_factory=list)
    """Ready, Progressing, Reconciling, Stalled, Degraded, SpecAccepted and one per component."""

    step: int | None = None
    """The latest training step (from the orchestrator or trainer)."""

    max_steps: int | None = None
    """`config.max_steps`."""

    reward: float | None = None
    """The latest mean training reward (RLRun)."""

    last_checkpoint_step: int | None = None
    """The step of the newest complete checkpoint."""

    restarts: int = 0
    """Gang restarts of the trainer after failures."""

    attempt: int = 0
    """Trainer starts so far minus one (restarts and resumes); above 0 the trainer resumes from
    the latest checkpoint."""

    start_time: datetime | None = None
    """When the run first started unsuspended (a run created suspended has none until it is
    released); `activeDeadlineSeconds` counts from here."""

    completion_time: datetime | None = None
    """When the run Succeeded or Failed."""

    inference: InferenceStatus | None = None
    """An RLRun's inference replicas: existing, ready, `ready/desired`, and their selector."""


KINDS = {"RLRun": RLRunSpec, "SFTRun": SFTRunSpec}
