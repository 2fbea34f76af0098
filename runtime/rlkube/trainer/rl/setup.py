"""Everything the RL trainer needs from torch, built once from the config: the process group,
the FSDP2-sharded model, optimizer, scheduler, and the collective helpers the loop calls."""

import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from rlkube.config import TrainerConfig

logger = logging.getLogger(__name__)


@dataclass
class TrainingEnv:
    rank: int
    world_size: int
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded weights on CPU, on rank 0 (an empty dict elsewhere). Every rank calls it."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _device(config: TrainerConfig, local_rank: int) -> torch.device:
    if config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _lr_lambda(config: TrainerConfig):
    warmup, total = config.scheduler.warmup_steps, config.max_steps
    floor = config.scheduler.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if config.scheduler.type == "constant":
            return 1.0
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        if config.scheduler.type == "linear":
            return floor + (1 - floor) * (1 - progress)
        import math

        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def build_training_env(config: TrainerConfig) -> TrainingEnv:
    """torchrun's env → process group (gloo on CPU, nccl on CUDA) → model → FSDP2 → AdamW."""
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    device = _device(config, int(os.environ.get("LOCAL_RANK", "0")))
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.manual_seed(config.seed)

    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32}.get(
        config.model.dtype, getattr(torch, config.model.dtype, torch.float32)
    )
    model = AutoModelForCausalLM.from_pretrained(
        config.model.name, dtype=dtype, trust_remote_code=config.model.trust_remote_code
    ).to(device)
    if dist.is_initialized():
        for layer in model.model.layers:
            fully_shard(layer, reshard_after_forward=config.parallel.reshard_after_forward)
        fully_shard(model, reshard_after_forward=config.parallel.reshard_after_forward)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.optim.lr, betas=config.optim.betas, weight_decay=config.optim.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(config))
    logger.info("rank %d/%d on %s: %s", rank, world_size, device, config.model.name)
    return TrainingEnv(rank, world_size, device, model, optimizer, scheduler)
