"""The status of an RLRun or SFTRun (phase, conditions, progress); the CRD's `status` schema is
generated from `RunStatus`."""

from datetime import datetime
from typing import Literal

from pydantic import Field

from rlkube_operator.schema import K8sModel

Phase = Literal["Pending", "Initializing", "Running", "Succeeded", "Failed", "Suspended"]


class Condition(K8sModel):
    """A standard Kubernetes condition (metav1.Condition)."""

    type: str
    """Ready, Progressing, Reconciling, Stalled, Degraded, SpecAccepted, InferenceReady,
    OrchestratorReady, TrainerReady, TeacherReady (a run with a teacher), JudgeReady (a run
    with a judge)."""

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


class ExportStatus(K8sModel):
    """The exported model directory (`spec.export`): `claimName` and `path`, or `url`."""

    claim_name: str | None = None
    """The claim that holds it."""

    path: str | None = None
    """The model directory's path in that claim (`<spec.export.path>/model`)."""

    url: str | None = None
    """The model directory's URL in the run's object store (`<spec.export.url>/model`)."""


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
    """The latest mean training reward (RLRun), to 4 significant digits."""

    eval_reward: float | None = None
    """The latest held-out reward of a run that evaluates (`config.orchestrator.eval`: the mean of
    its environments' avg@k), to 4 significant digits (RLRun)."""

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

    export: ExportStatus | None = None
    """Where `spec.export` wrote the final policy, once its export Job completed (condition
    `Exported`)."""
