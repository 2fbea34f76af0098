"""Build a Hugging Face causal LM from `ModelConfig`, sharded with FSDP2 from the start.

As torchtitan does: the model is made on the meta device, sharded, given memory for its own
shard only, and each rank reads just its slices of the checkpoint's safetensors
(`torch.distributed.checkpoint`'s Hugging Face reader). So host and device memory per rank grow
with model size / world size; `from_pretrained` would first put the whole model (cast to
float32: 4 bytes per parameter) on every rank.

Parameters are kept in float32 (the optimizer's master copy); `model.dtype` is the compute
dtype, applied by FSDP2's mixed-precision policy: `auto` means bfloat16 on GPUs and
float32 on CPUs.
"""

from pathlib import Path

import torch
from torch import nn

from rlkube.config import LoraConfig, ModelConfig, ParallelConfig
from rlkube.logs import get_logger
from rlkube.models.architectures import model_architecture
from rlkube.models.hub import checkpoint_dir
from rlkube.models.lora_math import is_adapter_key
from rlkube.trainer.experts import expert_sources, load_experts
from rlkube.trainer.lora import apply_lora, init_adapters

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


def build_model(
    config: ModelConfig, parallel: ParallelConfig, device: torch.device, dtype: torch.dtype,
    packed_attention: bool = False, lora: LoraConfig | None = None, lora_field: str = "trainer.lora",
) -> nn.Module:
    """The model sharded over all ranks on `device`, in float32, in training mode.

    `packed_attention`: attend through `rlkube.trainer.rl.attention` (the RL trainer's packed
    rows with shared prompts) instead of the model's default attention. `lora`: freeze the
    model and train adapters (rlkube.trainer.lora), added before sharding so FSDP2 shards them
    with their layer; they start from the seed set before (`torch.manual_seed`). `lora_field`:
    where `lora` sits in the run's config, for errors."""
    from transformers import GenerationConfig

    path = checkpoint_dir(config.name)
    extra = {}
    if packed_attention:
        from rlkube.trainer.rl.attention import register

        extra["attn_implementation"] = register()
    model = build_meta_model(config, **extra)
    if lora is not None:
        apply_lora(model, lora, lora_field)
    parallelize(model, parallel, dtype)
    model.to_empty(device=device)
    init_unsaved_buffers(model)
    load_checkpoint_shards(model, path)
    if lora is not None:
        init_adapters(model, torch.initial_seed())
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(path)
    model.config.use_cache = False
    model.train()
    return model


def build_meta_model(config: ModelConfig, **extra) -> nn.Module:
    """The model's modules on the meta device, in float32: its structure without memory (from
    its `config.json` alone: `rlkube.models.architectures`)."""
    from transformers import AutoModelForCausalLM

    model_config = model_architecture(config.name, config.trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            model_config, dtype=torch.float32, trust_remote_code=config.trust_remote_code, **extra
        )


def init_unsaved_buffers(model: nn.Module) -> None:
    """Recompute the buffers no checkpoint holds (rotary frequencies), left uninitialized by
    `to_empty`, with the model's own initializer (its `_init_weights`, the per-module hook
    Hugging Face models define)."""
    owners = {name.rpartition(".")[0] for name, _ in model.named_non_persistent_buffers()}
    with torch.no_grad():
        for owner in sorted(owners):
            model._init_weights(model.get_submodule(owner))


def load_checkpoint_shards(model: nn.Module, path: Path) -> None:
    """Collective: each rank reads its own slices of the safetensors under `path` into the
    sharded parameters (an MoE block's stacked experts from their per-expert tensors:
    rlkube.trainer.experts). Keys the files lack must be tied to ones they hold (lm_head);
    LoRA adapters are not in the checkpoint (`init_adapters` sets them)."""
    import torch.distributed.checkpoint as dcp
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model.name: {path} holds no *.safetensors weights (the trainer reads only safetensors)")
    stored: dict[str, Path] = {}
    for file in files:
        with safe_open(file, "pt") as f:
            stored.update(dict.fromkeys(f.keys(), file))
    state = {k: v for k, v in model.state_dict().items() if not is_adapter_key(k)}
    experts = {}
    for key, tensor in state.items():
        sources = None if key in stored else expert_sources(key, tensor.shape[0])
        if sources is not None and all(k in stored for keys in sources for k in keys):
            experts[key] = sources
    found = stored.keys() | experts.keys()
    tied: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if not is_adapter_key(name):
            tied.setdefault(id(param), []).append(name)
    buffers = set(state) - {name for names in tied.values() for name in names}
    missing = [names[0] for names in tied.values() if found.isdisjoint(names)] + sorted(buffers - found)
    if missing:
        raise ValueError(f"model.name: {path} lacks weights for {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    dcp.load({k: v for k, v in state.items() if k in stored}, storage_reader=dcp.HuggingFaceStorageReader(str(path)))
    for key, sources in experts.items():
        load_experts(state[key], sources, stored)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (`model.model.layers` in Hugging Face decoder models)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers")
    return list(layers)


def parallelize(model: nn.Module, parallel: ParallelConfig, dtype: torch.dtype) -> nn.Module:
    """Activation checkpointing (optional), then FSDP2 `fully_shard` per decoder layer and
    on the root, over all ranks (the parameters stay where they are: meta, in `build_model`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if parallel.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward)
    fully_shard(model, mp_policy=mp, reshard_after_forward=parallel.reshard_after_forward)
    return model


def count_parameters(model: nn.Module) -> int:
    """Parameters of the full (unsharded) model."""
    return sum(p.numel() for p in model.parameters())
