"""`rlkube export`: what to take out of a run, and where to put it."""

from pathlib import Path
from typing import Literal

from pydantic import Field

from rlkube.config.base import Config


class ExportConfig(Config):
    """`rlkube export --run DIR [--step N] [--out DIR] [--dtype D]`: write one step of an RL or
    SFT run as a Hugging Face model directory (safetensors with the base model's config and
    tokenizer) that transformers and vLLM load; a LoRA run's adapters merged into the base
    model, or as a PEFT adapter directory."""

    run: Path
    """The run's `output_dir`: it holds `configs/trainer.toml` (RL) or `configs/sft.toml` (SFT)
    and, unless the run's `ckpt.url` put them elsewhere, `checkpoints/`."""

    config: Path | None = None
    """The run's config file, as `rlkube rl` or `rlkube sft` wrote it; `<run>/configs/trainer.toml`
    or `<run>/configs/sft.toml` when unset."""

    step: int | None = Field(default=None, ge=0)
    """The step to export; the newest complete checkpoint (or snapshot, with `source = "weights"`)
    when unset."""

    source: Literal["checkpoint", "weights"] = "checkpoint"
    """`checkpoint`: the trainer's checkpoint of the step, in full precision, which every weights
    transport leaves. `weights`: the step's snapshot under the storage transport's `weights.url`
    (an RL run with `weights.type = "storage"`; the snapshot is in the wire dtype)."""

    out: str | None = None
    """The directory to write, or an fsspec URL (`s3://bucket/prefix/model`, with the store's
    credentials in the environment as for `ckpt.url`); `<run>/export/step_N` when unset. An
    earlier export there is replaced."""

    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """The dtype of the exported weights; `auto` keeps the base model's (its config.json `dtype`,
    float32 when it names none)."""

    lora: Literal["merge", "adapter"] | None = None
    """A LoRA run's export: `merge` (the default) writes the base model with the adapters added
    in; `adapter` the PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`)
    that vLLM serves with `--enable-lora`. Refused for a run that trained every weight."""
