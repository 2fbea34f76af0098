"""`rlkube sft`: supervised fine-tuning."""

from typing import Any, Literal

from pydantic import Field

from rlkube.config.base import Config
from rlkube.config.shared import PlannedGpuConfig, RunConfig
from rlkube.config.trainer import TrainerCommonConfig


class SFTDataConfig(Config):
    name: str = "reverse_text"
    """A built-in generator (`reverse_text`), a local file (`.jsonl`, `.json`, `.parquet`),
    a saved dataset directory, or a Hugging Face hub id."""

    args: dict[str, Any] = {}
    """Keyword arguments for a built-in generator (for `reverse_text`: `num_examples`, `min_len`, `max_len`)."""

    split: str = "train"
    """Dataset split."""

    layout: Literal["auto", "messages", "prompt_completion"] = "auto"
    """`messages`: a `messages` column of chat turns; `prompt_completion`: `prompt` and
    `completion` columns (strings or message lists). `auto` picks by the columns present."""

    loss_roles: list[Literal["system", "user", "assistant", "tool"]] = ["assistant"]
    """Roles whose tokens are trained on; all other tokens are masked out of the loss."""

    seq_len: int = Field(default=512, ge=8)
    """Tokens per packed row. Longer samples are truncated."""

    batch_size: int = Field(default=64, ge=1)
    """Samples per optimizer step, across all ranks."""

    shuffle: bool = True
    """Shuffle the dataset every epoch (seeded)."""


class SFTConfig(RunConfig, TrainerCommonConfig, PlannedGpuConfig):
    """`rlkube sft @ sft.toml`: fine-tune a model on a chat dataset."""

    data: SFTDataConfig = SFTDataConfig()
    """Training data."""

    weights_interval: int | None = Field(default=None, ge=1)
    """Export HF-format weights to `<output_dir>/weights/step_N/` every N steps; the final
    step is always exported."""

    metrics_interval: int = Field(default=1, ge=1)
    """Print and record metrics every N steps."""

    status_port: int | None = Field(default=None, ge=0, le=65535)
    """Serve `GET /status` (phase, step, max_steps, loss, last_checkpoint_step) from rank 0 on
    this port, for the operator's progress columns; off when unset, 0 picks a free port."""

    status_host: str = "127.0.0.1"
    """Address the status endpoint binds (the operator sets `0.0.0.0`)."""

    bench: bool = False
    """Benchmark mode: fake data, no checkpoints; prints tokens/s."""
