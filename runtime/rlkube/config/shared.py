"""Config pieces that several processes share: the model, checkpoints, logging, W&B."""

from pathlib import Path
from typing import Literal

from pydantic import Field

from rlkube.config.base import Config


class ModelConfig(Config):
    name: str = "outputs/tiny-model"
    """A local Hugging Face model directory (for example one written by `rlkube model init`) or a hub id."""

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype. `auto` means bfloat16 on GPUs and float32 on CPUs."""

    trust_remote_code: bool = False
    """Allow model code from the model directory (Hugging Face `trust_remote_code`)."""


class CheckpointConfig(Config):
    """Checkpoints under `<output_dir>/checkpoints/step_N/`. Present means enabled (`--ckpt`)."""

    interval: int | None = Field(default=None, ge=1)
    """Save every N steps (and always at the last step). None saves only at the end."""

    keep_last: int | None = Field(default=None, ge=1)
    """Keep only the newest N checkpoints. None keeps all."""

    keep_interval: int | None = Field(default=None, ge=1)
    """Never delete checkpoints whose step is a multiple of this, whatever `keep_last` says."""

    resume_step: int | Literal["latest"] | None = None
    """Resume from this step's checkpoint, or from the newest complete one with `latest`."""


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
