"""What the RL trainer needs from the shared trainer infrastructure, built once from config:
the process group, the FSDP2-sharded model, optimizer and scheduler (rlkube.trainer.*)."""

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from rlkube.config import TrainerConfig
from rlkube.models.lora_math import PEFT_PREFIX, is_adapter_key
from rlkube.trainer import dist as rdist
from rlkube.trainer.compile_cache import CompileCache
from rlkube.trainer.model import build_model, resolve_dtype
from rlkube.trainer.optim import build_optimizer, build_scheduler, clip_grad_norm
from rlkube.trainer.weights import full_state_dict


@dataclass
class TrainingEnv:
    rank: int
    world_size: int
    device: torch.device
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    lora: bool = False
    """Whether the model trains LoRA adapters on a frozen base (`trainer.lora`)."""
    compile_cache: CompileCache | None = None
    """Where compiled kernels are kept for restarts (activated before the model was built)."""

    def clip_grad_norm(self, max_norm: float | None) -> float:
        return clip_grad_norm(self.model, max_norm)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective: the unsharded weights on CPU, on rank 0 (empty elsewhere)."""
        return full_state_dict(self.model)

    def policy_tensors(self) -> dict[str, torch.Tensor]:
        """What a policy update carries, as this rank holds it (sharded DTensors; the
        publisher's snapshot gathers them): the adapters alone, under PEFT's names, in a LoRA
        run (`trainer.lora.serving`: served as an adapter or merged), else every weight but a
        tied output head: it is the embedding's tensor, which would be gathered, copied and sent
        a second time, and inference ties it itself (as for a `save_pretrained` checkpoint)."""
        if self.lora:
            return {PEFT_PREFIX + name: p for name, p in self.model.named_parameters() if is_adapter_key(name)}
        state = get_model_state_dict(self.model)
        if getattr(self.model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        return state

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        rdist.close_distributed()


def build_training_env(config: TrainerConfig) -> TrainingEnv:
    info, model, compile_cache = build_sharded_model(config)
    optimizer = build_optimizer(model, config.optim)
    scheduler = build_scheduler(optimizer, config.scheduler, config.max_steps)
    return TrainingEnv(
        info.rank, info.world_size, info.device, model, optimizer, scheduler, config.lora is not None, compile_cache
    )


def build_sharded_model(config: TrainerConfig) -> tuple[rdist.DistInfo, torch.nn.Module, CompileCache]:
    """The process group, the compile cache (activated first) and the FSDP2-sharded model:
    what a solo run's environment and a pool's trainer (rlkube.trainer.rl.multi_run) share."""
    info = rdist.init_distributed(config.device, config.cpu_threads, config.peer_timeout_s)
    compile_cache = CompileCache(config.output_dir, info.device, config.compile_cache_url, main=info.rank == 0)
    compile_cache.activate()
    torch.manual_seed(config.seed)
    dtype = resolve_dtype(config.model.dtype, info.device)
    model = build_model(config.model, config.parallel, info.device, dtype, packed_attention=True, lora=config.lora)
    return info, model, compile_cache
