"""The run's components as its spec sizes them: inference, teacher and judge servers, orchestrator,
env workers, trainer. Each is a child workload (`builders.py`) with its own `pod` settings."""

from typing import Any

from pydantic import Field
from rlkube.config import InferenceServerConfig, ModelConfig

from rlkube_operator.podsettings import PodSettings, Resources
from rlkube_operator.schema import K8sModel


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


class ServedModelConfig(ModelConfig):
    """The weights of a model the run serves beside the policy (a teacher, a judge), given as
    `config.model` gives the policy's."""

    name: str = Field(min_length=1)
    """A Hugging Face hub id, or a model directory on the run's volume (for example an SFTRun's
    export, `<mountPath>/<sft run>/weights/final`). Also the model name of the orchestrator's
    requests to it (`config.orchestrator.teacher.model`, `config.orchestrator.judge.model`)."""


class ServedModelSpec(ServersSpec):
    """A model the run serves beside the policy: vLLM servers `<run>-<teacher|judge>` (a
    StatefulSet with a headless Service) that the operator points the orchestrator at
    (`config.orchestrator.<teacher|judge>`: its `base_urls` and `model`). Its weights never
    change: it gets no weight updates and starts serving at once (not paused)."""

    model: ServedModelConfig
    """The served model."""

    server: InferenceServerConfig = InferenceServerConfig()
    """Its vLLM server, as `config.inference` sets the policy's (context length, memory, prefix
    caching, `extra_args`, startup timeout). The operator sets `host` and `tensor_parallel_size`
    (from `gpusPerReplica`)."""

    def client_settings(self) -> dict[str, Any]:
        """What the orchestrator's config of it takes from this spec, beyond its model and URLs."""
        return {}


class TeacherSpec(ServedModelSpec):
    """The teacher of on-policy distillation: it scores the student's sampled tokens with the
    teacher's log-probs; the loss that uses them is the trainer's (`config.trainer.loss`)."""


class JudgeSpec(ServedModelSpec):
    """The judge of environments scored by verifiers' judges (reference, rubric): every judge an
    environment plugs calls it, through a loopback endpoint in the orchestrator's and each env
    worker's process that adds the run's token (`rlkube.orchestrator.judge`)."""

    sampling: dict[str, Any] = Field(default_factory=dict)
    """Sampling of every judge call (`config.orchestrator.judge.sampling`: `temperature`,
    `max_tokens`, vLLM's `structured_outputs` and other keys)."""

    def client_settings(self) -> dict[str, Any]:
        return {"sampling": self.sampling} if "sampling" in self.model_fields_set else {}


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


class ToolServiceSpec(K8sModel):
    """The run's tool service (`rlkube tool-service`): a Deployment `<run>-tool-service` behind a
    Service of that name, which only the run's orchestrator and env workers reach (on `port`).
    Its address becomes the `tool_url` of every `tool_chain` env that sets none. CPU only.

    `replicas` is applied when the Deployment is created and whenever it changes in the spec;
    in between the Deployment's own count is left alone, so `kubectl scale` holds until the
    spec's `replicas` next changes."""

    replicas: int = Field(default=1, ge=0, le=256)
    """Tool service pods (a Service spreads the calls over them)."""

    port: int = Field(default=8790, ge=1024, le=65535)
    """The port the service listens on."""

    args: list[str] = Field(default_factory=list, max_length=64)
    """Further `rlkube tool-service` flags: its latency and failures (`--p50-s`, `--tail-ratio`,
    `--timeout-rate`, `--error-rate`, `--seed`)."""

    resources: Resources = Resources()
    """CPU and memory of each tool service pod."""

    pod: PodSettings = PodSettings()
    """Scheduling, env, volumes, labels and annotations of each tool service pod, over the
    run-level defaults (not the GPU nodes' nodeSelector and tolerations)."""


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
