"""What a run says about its pods: resources, scheduling, and each component's pod settings.

The run-level `scheduling` and a component's `pod` section merge in `pods.pod_settings`; what
the operator sets itself (`names.OPERATOR_ENV`, its labels and volumes) cannot be overridden.
"""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlkube_operator.names import OPERATOR_ENV, OPERATOR_VOLUMES, RESERVED_PREFIX, operator_label
from rlkube_operator.schema import K8sModel

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

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Node labels the pods require."""

    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
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
    and its volumes (`config`, `data`, `dshm`, `tmp`). Each list and map is bounded (the API
    server refuses a longer one, naming its size), so the guardrails' cost, whose rules walk
    them, is bounded too."""

    affinity: dict | None = None
    """A Kubernetes Affinity (nodeAffinity, podAffinity, podAntiAffinity)."""

    topology_spread_constraints: list[dict] = Field(default_factory=list, max_length=8)
    """Kubernetes TopologySpreadConstraints."""

    runtime_class_name: str | None = None
    """RuntimeClass of the pods (for example `nvidia`)."""

    service_account_name: str | None = None
    """ServiceAccount of these pods; the run-level `serviceAccountName` when unset."""

    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    """Environment variables of the container, after the operator's own."""

    env_from: list[dict] = Field(default_factory=list, max_length=32)
    """Kubernetes EnvFromSources (`secretRef`, `configMapRef`), after the object store's Secret."""

    volumes: list[dict] = Field(default_factory=list, max_length=32)
    """Extra Kubernetes Volumes of the pods, each with a `name` of its own."""

    volume_mounts: list[dict] = Field(default_factory=list, max_length=64)
    """Extra Kubernetes VolumeMounts of the container."""

    labels: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Extra pod labels."""

    annotations: dict[str, str] = Field(default_factory=dict, max_length=32)
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
