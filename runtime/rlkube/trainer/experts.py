"""Mixture-of-experts weights: the checkpoint's layout and the trainer's.

Checkpoints keep one linear layer per expert (`<block>.experts.<e>.gate_proj.weight`,
`up_proj`, `down_proj`): what the Hub ships, vLLM loads and transformers' `save_pretrained`
writes. transformers 5 models hold each MoE block's experts as two stacked parameters instead,
`<block>.experts.gate_up_proj` [experts, 2 * width, hidden] (every expert's gate rows, then its
up rows) and `<block>.experts.down_proj` [experts, hidden, width] (transformers'
`conversion_mapping`, "qwen2_moe", shared by Qwen3-MoE, DeepSeek-V3, OLMoE and others).

The trainer shards the stacked parameters on their first dimension (FSDP2), so each rank holds
whole experts: it reads just those experts' tensors from the checkpoint (`load_experts`), as it
reads just its slices of every other weight. Exports go back to the checkpoint layout
(`split_experts`), so vLLM and `from_pretrained` read them.
"""

import re
from pathlib import Path

import torch

STACKED = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}
"""Each stacked parameter of an `experts` module and the per-expert weights it concatenates
(along their output dimension), in order."""

_STACKED_KEY = re.compile(rf"^(?P<block>.+\.experts)\.(?P<name>{'|'.join(STACKED)})$")


def expert_sources(key: str, num_experts: int) -> list[list[str]] | None:
    """The checkpoint keys stacked into model key `key`: one list per expert, in the order
    they are concatenated; None when `key` is no stacked expert parameter."""
    match = _STACKED_KEY.match(key)
    if match is None:
        return None
    block, parts = match["block"], STACKED[match["name"]]
    return [[f"{block}.{e}.{part}.weight" for part in parts] for e in range(num_experts)]


def local_experts(param: torch.Tensor) -> range:
    """The experts (first-dimension indices) this rank holds of `param` (a DTensor sharded on
    dim 0, or a plain tensor: all of them)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(param, DTensor):
        return range(param.shape[0])
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return range(offset[0], offset[0] + shape[0])


@torch.no_grad()
def load_experts(param: torch.Tensor, sources: list[list[str]], files: dict[str, Path]) -> None:
    """Fill this rank's experts of stacked parameter `param` from the checkpoint tensors
    `sources` (`expert_sources`), each read from its file in `files` (key -> safetensors file).
    The rows of other experts are never read."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    local = param.to_local() if isinstance(param, DTensor) else param
    for row, expert in enumerate(local_experts(param)):
        parts = []
        for key in sources[expert]:
            with safe_open(files[key], "pt") as f:
                parts.append(f.get_tensor(key))
        local[row].copy_(torch.cat(parts, dim=0))


def split_experts(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A full state dict in the checkpoint layout: each stacked expert parameter replaced by
    its per-expert weights (copies: safetensors refuses tensors sharing memory); everything
    else as is."""
    out = {}
    for key, tensor in state_dict.items():
        sources = expert_sources(key, tensor.shape[0]) if tensor.dim() == 3 else None
        if sources is None:
            out[key] = tensor
            continue
        for expert, keys in enumerate(sources):
            for key_part, chunk in zip(keys, tensor[expert].chunk(len(keys), dim=0), strict=True):
                out[key_part] = chunk.clone()
    return out
