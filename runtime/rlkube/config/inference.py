"""`rlkube inference`: the vLLM server."""

from typing import Any, Literal

from pydantic import Field

from rlkube.config.base import Config
from rlkube.config.shared import LogConfig, ModelConfig

POLICY_ADAPTER = "rlkube-policy"
"""The model name inference serves a LoRA run's policy under (`max_lora_rank` set)."""


class InferenceServerConfig(Config):
    """How one vLLM OpenAI-compatible server is run."""

    host: str = "127.0.0.1"
    """Address to bind."""

    port: int = Field(default=8000, ge=1, le=65535)
    """Port of the first replica; replica i listens on `port + i` when run locally."""

    max_model_len: int | None = Field(default=None, ge=16)
    """Context length; the model's own when unset."""

    max_num_seqs: int = Field(default=256, ge=1)
    """Concurrent sequences per replica."""

    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """GPU only: fraction of GPU memory vLLM may use."""

    kv_cache_space_gb: int | None = Field(default=None, ge=1)
    """CPU only: KV-cache size in whole GiB (`VLLM_CPU_KVCACHE_SPACE`, which vLLM reads as an
    integer: its engine refuses to start on "0.5")."""

    enforce_eager: bool = False
    """Disable CUDA graphs / torch.compile (faster start, slower decode)."""

    enable_prefix_caching: bool = True
    """Reuse KV cache across requests sharing a prefix."""

    return_routed_experts: bool = False
    """Mixture-of-experts models: answer each generate request with the experts every token was
    routed to in every MoE layer, for the trainer's router metrics and router replay. On GPU,
    vLLM's `--enable-return-routed-experts` (its Model Runner V2; needs prefix caching); on CPU,
    rlkube's capture, which runs the model eagerly and without prefix caching
    (rlkube.inference.routing_capture). `rlkube rl` turns it on with `trainer.loss.router_replay`."""

    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """Which logprobs vLLM returns: `processed_logprobs` are taken after temperature scaling
    (what the trainer recomputes with per-token temperatures); `raw_logprobs` before it."""

    shm_spin_ms: float | None = Field(default=None, ge=0)
    """How long vLLM's engine core and workers busy-wait on their shared-memory queues after a
    message before sleeping on a notification. Unset: 5 ms on CPU, where the spin takes a core
    from the trainer and the orchestrator, and vLLM's own 1 s on GPU
    (`rlkube.inference.vllm_plugin`)."""

    tensor_parallel_size: int = Field(default=1, ge=1)
    """GPUs per replica (vLLM's `--tensor-parallel-size`); on Kubernetes the operator sets it
    from the run's `inference.gpusPerReplica`."""

    extra_args: dict[str, Any] = {}
    """Further vLLM engine arguments, passed as `--key value`."""

    startup_timeout_s: float = Field(default=600, gt=0)
    """How long to wait for the server to report healthy."""


class InferenceSection(InferenceServerConfig):
    """The `[inference]` section of an RL config."""

    replicas: int = Field(default=1, ge=1)
    """Data-parallel inference servers."""

    gpus: list[int] | None = None
    """`rlkube rl` on a GPU machine: the GPUs (indices among the visible ones) of the replicas,
    `tensor_parallel_size` per replica in order; the first ones when unset (`rlkube.launch.gpus`)."""


class ServedModelSection(InferenceServerConfig):
    """A model `rlkube rl` serves itself beside inference, unpaused and never updated: the
    `[teacher]` of on-policy distillation, the `[judge]` that scores rollouts."""

    model: ModelConfig
    """The served model."""

    replicas: int = Field(default=1, ge=1)
    """Servers of it (a task's requests go to one of them, for its prefix cache)."""

    gpus: list[int] | None = None
    """`rlkube rl` on a GPU machine: the GPUs (indices among the visible ones) of the replicas,
    `tensor_parallel_size` per replica in order; the ones after the trainer's (and the
    teacher's, for the judge) when unset (`rlkube.launch.gpus`)."""


class TeacherServerSection(ServedModelSection):
    """The `[teacher]` section of an RL config: `rlkube rl` serves the teacher of on-policy
    distillation itself, unpaused, and points `orchestrator.teacher` at it."""

    port: int = Field(default=8100, ge=1, le=65535)
    """Port of the first teacher replica; replica i listens on `port + i`."""


class JudgeServerSection(ServedModelSection):
    """The `[judge]` section of an RL config: `rlkube rl` serves the model that environments'
    verifiers judges call (`verifiers.v1.judges`), unpaused, and points `orchestrator.judge` at
    it."""

    port: int = Field(default=8200, ge=1, le=65535)
    """Port of the first judge replica; replica i listens on `port + i`."""

    sampling: dict[str, Any] = {}
    """The judge's sampling (`orchestrator.judge.sampling`)."""


class InferenceConfig(InferenceServerConfig):
    """`rlkube inference @ inference.toml`: one vLLM server with rlkube's weight-update extension."""

    model: ModelConfig = ModelConfig()
    """The model to serve."""

    seed: int = 0
    """Sampling seed."""

    max_lora_rank: int | None = Field(default=None, ge=1, le=512)
    """Serve a LoRA run's adapters with vLLM's LoRA support, up to this rank: each published
    adapter is loaded in place as the model `rlkube-policy` (`rlkube.inference.lora_serving`),
    and the base model keeps its weights. `rlkube rl` sets it from `trainer.lora.rank` when
    `trainer.lora.serving` is `adapter`. Unset: an adapter snapshot is merged into the base
    weights (`rlkube.inference.worker`)."""

    max_loras: int = Field(default=1, ge=1)
    """With `max_lora_rank`: adapters the engine holds at once. A solo run serves one (the
    policy); a pool's inference one per member (at least `pool.max_runs`), each under its
    member's name, which every request of that member names (rlkube.inference.lora_serving)."""

    start_paused: bool = True
    """Start with generation paused (`/health` answers once the engine is up, requests queue):
    the orchestrator loads the current policy, tags its version and resumes the server before
    any of its rollouts count, also after the server restarted mid-run. Without an orchestrator
    (a server for `rlkube eval`, or any plain use), set it to false or POST `/resume`."""

    log: LogConfig = LogConfig()
    """Logging."""
