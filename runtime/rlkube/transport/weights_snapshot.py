"""The HF-format weight snapshot: what the trainer publishes and inference loads.

A snapshot of policy step N is a directory `step_N/` holding safetensors shards, the model's
`config.json` (and its tokenizer files, so the snapshot is a servable model directory of its
own), and a `COMPLETE` marker written last. The marker makes publishing atomic on any fsspec
filesystem, object stores included, where a directory rename is not atomic: a reader refuses a
snapshot without it, so it never loads half a snapshot.

Everything here works on in-memory `{file name: bytes}` maps, so the storage transport (write
the files) and the gRPC transport (stream the files) share one format.
"""

import json
import posixpath
from collections.abc import Iterator
from pathlib import Path

import torch

COMPLETE = "COMPLETE"
"""Marker file written after every other file of a snapshot."""

MAX_SHARD_BYTES = 4 * 1024**3
"""Safetensors shards are cut at this size (HF's convention is a few GB per shard)."""

_MODEL_FILES = ("config.json", "generation_config.json", "chat_template.jinja", "rlkube_model.json")
_TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "vocab", "merges")


def step_dir(root: str, step: int) -> str:
    return posixpath.join(root.rstrip("/"), f"step_{step}")


def model_files(model_dir: str | Path) -> dict[str, bytes]:
    """The non-weight files of a local model directory (config, generation config, tokenizer)."""
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"model.name: {model_dir} has no config.json; weight snapshots need the model's "
            "config next to the weights (use a local Hugging Face model directory)"
        )
    return {
        path.name: path.read_bytes()
        for path in sorted(model_dir.iterdir())
        if path.is_file() and (path.name in _MODEL_FILES or path.name.startswith(_TOKENIZER_PREFIXES))
    }


def _detached(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous, and no two tensors sharing storage (safetensors refuses shared storage,
    which tied embeddings have)."""
    out, seen = {}, set()
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to("cpu").contiguous()
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        if key in seen:
            tensor = tensor.clone()
        seen.add(key)
        out[name] = tensor
    return out


def _shards(state_dict: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def weight_files(
    state_dict: dict[str, torch.Tensor], max_shard_bytes: int = MAX_SHARD_BYTES
) -> dict[str, bytes]:
    """Safetensors shards (plus the HF index when there is more than one) as bytes."""
    from safetensors.torch import save

    if not state_dict:
        raise ValueError("cannot publish an empty state dict")
    shards = _shards(_detached(state_dict), max_shard_bytes)
    if len(shards) == 1:
        return {"model.safetensors": save(shards[0], metadata={"format": "pt"})}
    files, weight_map = {}, {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        files[name] = save(shard, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    files["model.safetensors.index.json"] = json.dumps(index, indent=2).encode()
    return files


def snapshot_files(
    state_dict: dict[str, torch.Tensor], step: int, model_dir: str | Path,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, bytes]:
    """Every file of a snapshot, the `COMPLETE` marker last (dicts keep insertion order)."""
    files = model_files(model_dir)
    files.update(weight_files(state_dict, max_shard_bytes))
    files[COMPLETE] = json.dumps({"step": step, "files": sorted(files)}).encode()
    return files


def iter_safetensors(files: dict[str, bytes]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of every safetensors file in a snapshot held in memory."""
    from safetensors.torch import load

    for name in sorted(files):
        if name.endswith(".safetensors"):
            yield from load(files[name]).items()
