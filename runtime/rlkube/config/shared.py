"""Config pieces that several processes share: the model, checkpoints, logging, W&B."""

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from rlkube.config.base import Config
from rlkube.config.gpus import GpuName


class ModelConfig(Config):
    name: str = "outputs/tiny-model"
    """A local Hugging Face model directory (for example one written by `rlkube model init`) or a hub id."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype. `auto` means bfloat16 on GPUs and float32 on CPUs."""

    trust_remote_code: bool = False
    """Allow model code from the model directory (Hugging Face `trust_remote_code`)."""


class CheckpointConfig(Config):
    """Checkpoints under `<ckpt.url or output_dir/checkpoints>/<process>/step_N/`, each part marked
    `COMPLETE` last. Present means enabled (`--ckpt`)."""

    url: str | None = None
    """A path or fsspec URL (`s3://bucket/run/checkpoints`) where checkpoints go;
    `<output_dir>/checkpoints` when unset."""

    interval: int | None = Field(default=None, ge=1)
    """Save every N steps (and always at the last step). None saves only at the end."""

    keep_last: int | None = Field(default=None, ge=1)
    """Keep only the newest N checkpoints. None keeps all."""

    keep_interval: int | None = Field(default=None, ge=1)
    """Never delete checkpoints whose step is a multiple of this, whatever `keep_last` says."""

    resume_step: int | Literal["latest"] | None = None
    """Resume from this step's checkpoint (an error if it is not complete), or with `latest` from
    the newest complete one, starting fresh when there is none yet."""


class LogConfig(Config):
    level: Literal["debug", "info", "warning", "error"] = "info"
    """Log level of the process."""


class WandbConfig(Config):
    """Weights & Biases logging. Present means enabled (`--wandb`); `--no-wandb` turns it off."""

    project: str = "rlkube"
    """W&B project."""

    name: str | None = None
    """Run name; the output directory's name when unset."""

    entity: str | None = None
    """W&B entity (team or user)."""

    mode: Literal["online", "offline"] = "offline"
    """`offline` writes under `<output_dir>/wandb` and needs no network; sync later with `wandb sync`."""

    group: str | None = None
    """Run group; the trainer and orchestrator of one RL run share it."""


class RunConfig(Config):
    """Fields every top-level command has."""

    output_dir: Path = Path("outputs/run")
    """Where logs, metrics, checkpoints and weights go."""

    clean_output_dir: bool = False
    """Delete the output directory before starting (refused when resuming)."""

    max_steps: int = Field(default=100, ge=1)
    """Train until this step (absolute, also when resuming)."""

    seed: int = 0
    """Random seed."""

    model: ModelConfig = ModelConfig()
    """The model to train or serve."""

    ckpt: CheckpointConfig | None = None
    """Checkpointing; off unless given."""

    wandb: WandbConfig | None = None
    """W&B logging; off unless given."""

    log: LogConfig = LogConfig()
    """Logging."""


class PlannedGpuConfig(Config):
    """The GPU a top-level command's config is written for."""

    gpu: GpuName | None = None
    """The GPU the run is planned for (its memory: `rlkube.config.gpus`). `--dry-run` prints the
    estimated memory per GPU of the trainer (and of inference) from the model's shape, and the
    CLI refuses a config whose estimate does not fit this GPU, with the numbers. Unset: the
    estimate is printed, nothing is refused."""


class ModelInitConfig(Config):
    """`rlkube model init --out DIR [--moe]`: write an untrained tiny Qwen3 (or Qwen3-MoE) model
    with a byte-level tokenizer, Qwen3's special tokens and chat template (for tests and examples)."""

    out: Path = Path("outputs/tiny-model")
    """Directory to write the Hugging Face model into."""

    layers: int = Field(default=4, ge=1)
    """Decoder layers."""

    hidden: int = Field(default=256, ge=8)
    """Hidden size; a multiple of `heads`."""

    heads: int = Field(default=4, ge=1)
    """Attention heads (head dim = hidden / heads)."""

    kv_heads: int = Field(default=2, ge=1)
    """Key/value heads (grouped-query attention); divides `heads`."""

    intermediate: int | None = Field(default=None, ge=1)
    """MLP width (each expert's with `moe`); 2 * hidden when unset, hidden with `moe`."""

    max_position_embeddings: int = Field(default=4096, ge=16)
    """Longest context the model accepts."""

    moe: bool = False
    """Make a Qwen3-MoE (`Qwen3MoeForCausalLM`): every layer's MLP is `experts` experts."""

    experts: int = Field(default=4, ge=2)
    """Experts per layer (with `moe`)."""

    experts_per_token: int = Field(default=2, ge=1)
    """Experts each token is routed to, top-k (with `moe`); at most `experts`."""

    seed: int = 0
    """Seed of the random initialization."""

    @model_validator(mode="after")
    def _shapes_divide(self):
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"experts_per_token ({self.experts_per_token}) exceeds experts ({self.experts})"
            )
        return self
