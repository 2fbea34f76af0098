"""Load a Hugging Face causal LM from `ModelConfig` and shard it with FSDP2.

Parameters are kept in float32 (the optimizer's master copy); `model.dtype` is the compute
dtype, applied by FSDP2's mixed-precision policy: `auto` means bfloat16 on GPUs and
float32 on CPUs.
"""

import torch
from torch import nn

from rlkube.config import ModelConfig, ParallelConfig
from rlkube.logs import get_logger

logger = get_logger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """The compute dtype: `auto` is bfloat16 on CUDA, float32 elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[name]


def load_tokenizer(config: ModelConfig):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(config.name, trust_remote_code=config.trust_remote_code)


def load_model(config: ModelConfig, packed_attention: bool = False) -> nn.Module:
    """The model on CPU in float32, in training mode, ready for `parallelize`.

    `packed_attention`: attend through `rlkube.trainer.rl.attention` (the RL trainer's packed
    rows with shared prompts) instead of the model's default attention."""
    from transformers import AutoModelForCausalLM

    extra = {}
    if packed_attention:
        from rlkube.trainer.rl.attention import register

        extra["attn_implementation"] = register()
    model = AutoModelForCausalLM.from_pretrained(
        config.name, dtype=torch.float32, trust_remote_code=config.trust_remote_code, **extra
    )
    model.config.use_cache = False
    model.train()  # from_pretrained returns eval mode, which also turns activation checkpointing off
    return model


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (`model.model.layers` in Hugging Face decoder models)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers")
    return list(layers)


def parallelize(
    model: nn.Module, parallel: ParallelConfig, device: torch.device, dtype: torch.dtype
) -> nn.Module:
    """Activation checkpointing (optional), then FSDP2 `fully_shard` per decoder layer and
    on the root, over all ranks; moves the model to `device`."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if parallel.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.to(device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward)
    return model


def count_parameters(model: nn.Module) -> int:
    """Parameters of the full (unsharded) model."""
    return sum(p.numel() for p in model.parameters())
