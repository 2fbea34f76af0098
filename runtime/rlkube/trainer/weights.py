"""Export the full model as a Hugging Face directory (safetensors + config + tokenizer), or a
LoRA run's adapters as a PEFT directory (`adapter_config.json` + `adapter_model.safetensors`).

The full model loads with `transformers` and vLLM (`LLM(model=dir)` or
`collective_rpc("reload_weights", kwargs={"weights_path": dir})`). Written to a `.tmp`
sibling and renamed, so readers never see a partial export.
"""

import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from rlkube.config import LoraConfig
from rlkube.models.lora_math import merge_adapters
from rlkube.trainer.experts import split_experts
from rlkube.trainer.lora import adapter_config, adapter_state_dict


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the unsharded state dict, on CPU, on rank 0 (empty on other ranks)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def save_hf_dir(state_dict: dict[str, torch.Tensor], model: nn.Module, tokenizer, out_dir: Path, dtype: torch.dtype | None = None) -> Path:
    """Write `state_dict` with `model`'s config and `tokenizer` as an HF directory (atomically),
    an MoE model's experts one linear layer each, as checkpoints keep them (rlkube.trainer.experts)."""
    from safetensors.torch import save_file

    tmp = fresh_tmp(out_dir)
    tensors = {}
    tied = getattr(model.config, "tie_word_embeddings", False)
    for name, tensor in split_experts(state_dict).items():
        if tied and name == "lm_head.weight":
            continue  # shared with embed_tokens; safetensors refuses aliased tensors
        tensor = tensor.detach().to("cpu")
        tensors[name] = (tensor.to(dtype) if dtype is not None else tensor).contiguous()
    save_file(tensors, tmp / "model.safetensors", metadata={"format": "pt"})
    model.config.save_pretrained(tmp)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    _copy_model_extras(model, tmp)
    return replace_dir(tmp, out_dir)


def fresh_tmp(out_dir: Path) -> Path:
    """An empty `.tmp` sibling of `out_dir` to write the export into."""
    out_dir = Path(out_dir)
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def replace_dir(tmp: Path, out_dir: Path) -> Path:
    """Move the finished `tmp` to `out_dir`, replacing an older export."""
    out_dir = Path(out_dir)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir


def _copy_model_extras(model: nn.Module, tmp: Path) -> None:
    """Keep rlkube's renderer hint with the weights, so exported models render like their base."""
    source = Path(getattr(model.config, "_name_or_path", "") or "")
    hint = source / "rlkube_model.json"
    if hint.is_file():
        shutil.copy(hint, tmp / hint.name)


def export_hf_weights(model: nn.Module, tokenizer, out_dir: Path, *, is_main: bool, lora: LoraConfig | None = None) -> Path:
    """Collective: gather the full weights and write them on rank 0 to `out_dir` (a LoRA
    model's with its adapters merged)."""
    state_dict = full_state_dict(model)
    if is_main and lora is not None:
        state_dict = merge_adapters(state_dict, lora.scaling)
    if is_main:
        save_hf_dir(state_dict, model, tokenizer, out_dir)
    dist.barrier()
    return Path(out_dir)


def export_adapter(model: nn.Module, lora: LoraConfig, base_model: str, out_dir: Path, *, is_main: bool) -> Path:
    """Collective: gather the LoRA adapters and write them on rank 0 to `out_dir` as a PEFT
    directory (loads with `peft.PeftModel.from_pretrained(base, out_dir)`)."""
    from safetensors.torch import save_file

    from rlkube.transport.weights_snapshot import ADAPTER_CONFIG, ADAPTER_WEIGHTS

    state_dict = adapter_state_dict(model)
    if is_main:
        tmp = fresh_tmp(out_dir)
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(adapter_config(lora, base_model), indent=2))
        save_file({k: v.contiguous() for k, v in state_dict.items()}, tmp / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        replace_dir(tmp, out_dir)
    dist.barrier()
    return Path(out_dir)
