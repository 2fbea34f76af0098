"""LoRA: low-rank adapters on frozen linear layers, and their PEFT file layout.

Each targeted `nn.Linear` becomes a `LoraLinear` that keeps the base `weight`/`bias` under
their own names (so the model still loads its checkpoint as is) and adds `lora_A` (r x in,
Kaiming-uniform, as PEFT) and `lora_B` (out x r, zeros): `y = x W^T + b + s * B(A(x))` with
`s = alpha / rank`, which is the base model's output until B moves. Everything but the
adapters is frozen, so the optimizer, checkpoints and weight updates carry the adapters only.

The adapters travel in PEFT's layout (`adapter_config.json` + `adapter_model.safetensors`,
keys `base_model.model.<module>.lora_A.weight`), which inference merges into its base weights
(rlkube.models.lora_math, also used for the merged export).

Mixture-of-experts models: LoRA adapts their attention (and any dense MLP layer); the experts
and the router stay frozen. An MoE block holds its experts as stacked 3-D parameters
(rlkube.trainer.experts), not linear layers, so the MLP names in `target_modules`
(`gate_proj`, `up_proj`, `down_proj`, in the defaults) match no expert and are accepted
without adapting one; adapting experts would take an adapter per expert and vLLM's fused-MoE
LoRA path, which rlkube does not use. Train the experts with full fine-tuning.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from rlkube.config import LoraConfig
from rlkube.models.lora_math import LORA_A, PEFT_PREFIX, is_adapter_key
from rlkube.trainer.experts import STACKED


class LoraLinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update."""

    def __init__(self, base: nn.Linear, rank: int, scaling: float, dropout: float) -> None:
        super().__init__()
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.register_parameter("bias", base.bias)
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **factory)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **factory)
        self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


def _linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: module for name, module in model.named_modules() if isinstance(module, nn.Linear)}


def _expert_names(model: nn.Module) -> set[str]:
    """The per-expert projection names of an MoE model's stacked experts (none in a dense one)."""
    if any(name.endswith(".experts") for name, _ in model.named_modules()):
        return {part for parts in STACKED.values() for part in parts}
    return set()


def unmatched_targets(model: nn.Module, target_modules: list[str]) -> str | None:
    """Why `target_modules` do not fit `model` (some name no linear layer of it, nor an
    expert projection of an MoE model: those stay frozen; or none adapts a layer), or None."""
    linear = sorted({name.rpartition(".")[2] for name in _linear_layers(model)})
    if unmatched := sorted(set(target_modules) - set(linear) - _expert_names(model)):
        return f"{unmatched} name no linear layer of {type(model).__name__} (its linear layers: {linear})"
    if set(target_modules).isdisjoint(linear):
        return (f"{sorted(target_modules)} adapt no layer of {type(model).__name__}: its experts stay frozen "
                f"(its linear layers: {linear})")
    return None


def apply_lora(model: nn.Module, config: LoraConfig, field: str = "trainer.lora") -> nn.Module:
    """Freeze `model` and wrap every linear layer named in `config.target_modules` (works on
    the meta device, before FSDP sharding; `init_adapters` gives the adapters their values).
    `field`: where `config` sits in the run's config, for the error."""
    if reason := unmatched_targets(model, config.target_modules):
        raise ValueError(f"{field}.target_modules: {reason}")
    targets = {name: module for name, module in _linear_layers(model).items()
               if name.rpartition(".")[2] in config.target_modules}
    model.requires_grad_(False)
    for name, module in targets.items():
        parent, _, child = name.rpartition(".")
        model.get_submodule(parent).register_module(
            child, LoraLinear(module, config.rank, config.scaling, config.dropout)
        )
    return model


@torch.no_grad()
def init_adapters(model: nn.Module, seed: int) -> None:
    """A: Kaiming-uniform (PEFT's init), B: zeros, so the initial policy is the base model.
    Each full tensor is drawn from `seed` on every rank and this rank keeps its shard, so
    the values do not depend on the world size."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if not is_adapter_key(name):
            continue
        full = torch.zeros(param.shape, dtype=param.dtype)
        if name.endswith(LORA_A):
            nn.init.kaiming_uniform_(full, a=math.sqrt(5), generator=generator)
        if isinstance(param, DTensor):
            full = distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
        param.copy_(full)


def adapter_config(config: LoraConfig, base_model: str) -> dict:
    """PEFT's `adapter_config.json` for these adapters."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": config.rank, "lora_alpha": config.alpha, "lora_dropout": config.dropout,
        "target_modules": list(config.target_modules), "bias": "none", "fan_in_fan_out": False,
        "use_rslora": False, "modules_to_save": None, "inference_mode": True,
    }


def adapter_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the adapters, unsharded on CPU, under PEFT's names, on rank 0 (empty
    elsewhere). Only the adapters are gathered, one by one: the frozen base never moves
    (DCP's `ignore_frozen_params` would still gather a frozen weight tied to another: lm_head)."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    is_main = not dist.is_initialized() or dist.get_rank() == 0
    state = {}
    for name, param in model.named_parameters():
        if is_adapter_key(name):
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if is_main:
                state[PEFT_PREFIX + name] = full.detach().to("cpu", copy=True)
    return state
