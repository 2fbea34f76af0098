"""AdamW, the learning-rate schedule and gradient clipping, from config."""

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from rlkube.config import OptimizerConfig, SchedulerConfig


def build_optimizer(model: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the trainable parameters only (a LoRA run's adapters, not its frozen base)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(trainable, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)


def lr_factor(step: int, config: SchedulerConfig, max_steps: int) -> float:
    """The multiplier of the peak lr for optimizer step `step` (0-based): linear warm-up to
    1 over `warmup_steps`, then constant, or linear/cosine decay to `min_lr_ratio` at `max_steps`
    (over the last `decay_steps` steps when set, at the peak before)."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.type == "constant":
        return 1.0
    decay_start = config.warmup_steps
    if config.decay_steps is not None:
        decay_start = max(decay_start, max_steps - config.decay_steps)
    progress = min(1.0, max(0.0, step - decay_start) / max(1, max_steps - decay_start))
    if config.type == "linear":
        shape = 1.0 - progress
    else:
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.min_lr_ratio + (1.0 - config.min_lr_ratio) * shape


def build_scheduler(optimizer: torch.optim.Optimizer, config: SchedulerConfig, max_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, config, max_steps))


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> float:
    """Clip the global gradient norm (over all ranks' shards) and return it before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else math.inf)
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
        norm = norm.full_tensor()
    return norm.item()
