"""The HF-format weight snapshot: what the trainer publishes and inference loads.

A snapshot of policy step N is a directory `step_N/` holding safetensors shards, the model's
`config.json` (and its tokenizer files, so the snapshot is a servable model directory of its
own), and a `COMPLETE` marker written last. The marker makes publishing atomic on any fsspec
filesystem, object stores included, where a directory rename is not atomic: a reader refuses a
snapshot without it, so it never loads half a snapshot.

The storage transport writes a `Snapshot`'s files, the gRPC transport holds them in memory and
streams them: one format for both. A LoRA run's snapshot is a PEFT adapter directory instead
(`adapter_config.json` + `adapter_model.safetensors`, rlkube.trainer.lora), which inference
serves as a vLLM LoRA adapter or merges into its own base weights (`trainer.lora.serving`).
"""

import json
import posixpath
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ADAPTER_CONFIG = "adapter_config.json"
"""PEFT's adapter config: its presence makes a snapshot a LoRA adapter."""
ADAPTER_WEIGHTS = "adapter_model.safetensors"

COMPLETE = "COMPLETE"
"""Marker file written after every other file of a snapshot."""

MAX_SHARD_BYTES = 4 * 1024**3
"""Safetensors shards are cut at this size (HF's convention is a few GB per shard)."""
PARALLEL_SHARDS = 4
"""Shards written at once (each its own upload to an object store)."""
WRITE_BYTES = 32 * 1024**2
"""A shard goes to an object store in writes of at most this size (fsspec uploads a part
whenever its buffer passes the file's block size)."""

_MODEL_FILES = ("config.json", "generation_config.json", "chat_template.jinja", "rlkube_model.json")
_TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "vocab", "merges")
_METADATA = {"format": "pt"}


def step_dir(root: str, step: int) -> str:
    return posixpath.join(root.rstrip("/"), f"step_{step}")


def bases_needed(kept: list[int], base_of: Callable[[int], int | None]) -> set[int]:
    """The steps the `kept` snapshots build on, back to full snapshots: a delta's marker names
    its `base` step (rlkube.transport.weights_delta), a full snapshot's none. Pruning spares them."""
    needed: set[int] = set()
    for step in kept:
        base = base_of(step)
        while base is not None and base not in needed:
            needed.add(base)
            base = base_of(base)
    return needed


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


class Snapshot:
    """Policy `step` as the files of a servable model directory. The weight shards stay tensors
    until they are written or sent: on local storage `safetensors.torch.save_file` streams each
    shard straight into its file, where serializing to bytes first would build (and page in) a
    whole extra copy of the model per publish."""

    def __init__(
        self, state_dict: dict[str, torch.Tensor], step: int, model_dir: str | Path,
        max_shard_bytes: int = MAX_SHARD_BYTES, adapter_config: dict | None = None,
    ):
        if not state_dict:
            raise ValueError("cannot publish an empty state dict")
        self.step = step
        if adapter_config is not None:  # LoRA adapters only: small, one file
            self.model_files = {ADAPTER_CONFIG: json.dumps(adapter_config, indent=2).encode()}
            self.shards = {ADAPTER_WEIGHTS: _detached(state_dict)}
            return
        self.model_files = model_files(model_dir)
        shards = _shards(_detached(state_dict), max_shard_bytes)
        if len(shards) == 1:
            self.shards = {"model.safetensors": shards[0]}
            return
        self.shards = {f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors": shard for i, shard in enumerate(shards)}
        weight_map = {name: file for file, shard in self.shards.items() for name in shard}
        total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        self.model_files["model.safetensors.index.json"] = json.dumps(index, indent=2).encode()

    def marker(self) -> bytes:
        return json.dumps({"step": self.step, "files": sorted([*self.model_files, *self.shards])}).encode()

    def files(self, buffer_of: Callable[[int], bytearray] = bytearray) -> dict[str, bytes | bytearray]:
        """Every file in memory (what the gRPC server holds and streams), the marker last. Each
        shard is written into `buffer_of(its size)`: the gRPC publisher hands out buffers of
        snapshots it no longer serves, since a copy into memory already touched runs several
        times faster than into fresh pages."""
        shards = {name: _serialized_into(shard, buffer_of) for name, shard in self.shards.items()}
        return {**self.model_files, **shards, COMPLETE: self.marker()}

    def write_files(self, fs, directory: str) -> None:
        """Every file but the marker into `directory` on `fs` (the caller writes the marker
        last), the shards in parallel."""
        for name, data in self.model_files.items():
            fs.pipe_file(f"{directory}/{name}", data)
        with ThreadPoolExecutor(max_workers=min(len(self.shards), PARALLEL_SHARDS)) as pool:
            for done in [pool.submit(_write_shard, fs, f"{directory}/{name}", shard)
                         for name, shard in self.shards.items()]:
                done.result()


def _write_shard(fs, path: str, shard: dict[str, torch.Tensor]) -> None:
    """One safetensors file, the bytes `safetensors.torch.save` makes. On a local disk
    `save_file` streams it into the file; elsewhere (an object store) it is written piece by
    piece from the tensors' own memory, uploaded in parts as it goes, never held whole."""
    from fsspec.implementations.local import LocalFileSystem
    from safetensors.torch import save_file

    if isinstance(fs, LocalFileSystem):
        save_file(shard, path, metadata=_METADATA)
        return
    header, tensors = _safetensors_layout(shard)
    with fs.open(path, "wb") as f:
        f.write(header)
        for tensor in tensors:
            data = memoryview(tensor.numpy())
            for start in range(0, len(data), WRITE_BYTES):
                f.write(data[start : start + WRITE_BYTES])


def _safetensors_layout(shard: dict[str, torch.Tensor]) -> tuple[bytes, list[torch.Tensor]]:
    """What `safetensors.torch.save` writes, in two parts: the header (its 8-byte size, the JSON
    of dtype, shape and byte offsets per tensor, padded to 8 bytes), then each tensor's bytes,
    here as flat uint8 views in safetensors' order (wider dtypes first, then by name)."""
    ordered = sorted(shard.items(), key=lambda item: (-item[1].element_size(), item[0]))
    header, offset = {"__metadata__": _METADATA}, 0
    for name, tensor in ordered:
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    return len(encoded).to_bytes(8, "little") + encoded, [t.reshape(-1).view(torch.uint8) for _, t in ordered]


def _serialized_into(shard: dict[str, torch.Tensor], buffer_of: Callable[[int], bytearray]) -> bytearray:
    """`shard` as a safetensors file in `buffer_of(size)`: a copy into memory that may be reused."""
    header, tensors = _safetensors_layout(shard)
    buffer = buffer_of(len(header) + sum(t.numel() for t in tensors))
    buffer[: len(header)] = header
    target, offset = torch.frombuffer(buffer, dtype=torch.uint8), len(header)
    for tensor in tensors:
        target[offset : offset + tensor.numel()].copy_(tensor)
        offset += tensor.numel()
    return buffer


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}


def iter_safetensors(files: dict[str, bytes | bytearray]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs of every safetensors file in a snapshot held in memory. Tensors of a
    `bytearray` file are views of it, not copies (`safetensors.torch.load` copies each one): the
    format is an 8-byte little-endian header size, a JSON header of dtype, shape and byte
    offsets per tensor, then the data."""
    for name in sorted(files):
        if not name.endswith(".safetensors"):
            continue
        data = files[name]
        if not isinstance(data, bytearray):
            data = bytearray(data)
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        header.pop("__metadata__", None)
        raw = torch.frombuffer(data, dtype=torch.uint8)[8 + size :]
        for key, entry in header.items():
            start, end = entry["data_offsets"]
            yield key, raw[start:end].view(_DTYPES[entry["dtype"]]).view(entry["shape"])
