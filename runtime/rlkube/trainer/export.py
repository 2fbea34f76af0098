"""A run's policy at one step as a Hugging Face model directory (`rlkube export`).

From the trainer's checkpoint by default: every weights transport leaves one (gRPC, NIXL and
NCCL leave nothing else), and it holds the float32 master weights. It is read on one process
with no process group: DCP reshards on load, so a checkpoint of any number of ranks reads as
whole tensors. The trainer saves its parameters under the model's own names (`get_state_dict`
strips FSDP2's and activation checkpointing's wrappers), which are the Hugging Face names but
for an MoE model's stacked experts (split back: rlkube.trainer.experts): an RL part keeps them
in `trainer/step_N/dcp/` under `model.`, an SFT part in `trainer/step_N/` under `app.model.`
(rlkube.trainer.ckpt). A LoRA run's checkpoint holds the adapters alone, the base weights being
`model.name`'s, unchanged.

Or from a storage-transport snapshot (`source = "weights"`), read as inference reads it (a delta
applied to its bases: rlkube.transport.weights_delta).

A checkpoint part is checked against its signed manifest before DCP unpickles anything of it
(rlkube.manifest, with the run's `RLKUBE_CHECKPOINT_KEY` when set): a planted or altered file is
`manifest.Refused`, naming it, as it is for the trainer's resume.

The directory is written as the trainer's snapshots are (rlkube.transport.weights_snapshot:
safetensors shards, the base model's config and tokenizer files): locally into a `.tmp` sibling
renamed into place, to an object store (`out = "s3://…"`, fsspec, the store's credentials from
the environment) with its config written last. Every bad input is a `ConfigError` naming the
field; the command exits 2 on it and on a refused checkpoint.
"""

import json
import warnings
from pathlib import Path

import fsspec
import torch
import torch.distributed.checkpoint as dcp
from fsspec.implementations.local import LocalFileSystem
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from rlkube.checkpoints import MARKER, checkpoint_root, complete_steps, part_dir
from rlkube.config import ConfigError, SFTConfig, TrainerConfig, load_config
from rlkube.config.export import ExportConfig
from rlkube.models.hub import checkpoint_dir
from rlkube.models.lora_math import PEFT_PREFIX, merge_adapters
from rlkube.trainer.ckpt import verified_part
from rlkube.trainer.experts import split_experts
from rlkube.trainer.lora import adapter_config
from rlkube.trainer.weights import fresh_tmp, replace_dir
from rlkube.transport.weights_snapshot import Snapshot, step_dir

PROCESS = "trainer"
RUN_CONFIGS = {"trainer.toml": TrainerConfig, "sft.toml": SFTConfig}
"""The config file each kind of run writes under `<output_dir>/configs/`, and its model."""
MODEL_CONFIGS = ("config.json", "adapter_config.json")
"""The files that make a directory a model (or adapter) directory."""
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export(config: ExportConfig) -> str:
    """Write the step `config` names as a model directory; returns its path or URL."""
    run = load_run_config(config)
    if run.lora is None and config.lora is not None:
        raise ConfigError(f"lora: {config.run} trained every weight (its config has no lora): there is no adapter to "
                          f"{'merge' if config.lora == 'merge' else 'export'}; leave `lora` unset")
    base_dir = checkpoint_dir(run.model.name)
    step, tensors = checkpoint_state(config, run) if config.source == "checkpoint" else snapshot_state(config, run)
    out = config.out or str(config.run / "export" / f"step_{step}")
    fs, out_path = fsspec.core.url_to_fs(out)
    check_out(fs, out_path, base_dir)
    model_config = json.loads((base_dir / "config.json").read_text())
    dtype_name = config.dtype if config.dtype != "auto" else model_config.get("dtype") or model_config.get("torch_dtype") or "float32"
    dtype = _DTYPES[dtype_name]
    if run.lora is not None and config.lora == "adapter":
        adapters = {PEFT_PREFIX + name: tensor.to(dtype) for name, tensor in tensors.items()}
        snapshot = Snapshot(adapters, step, base_dir, adapter_config=adapter_config(run.lora, run.model.name))
    else:
        if run.lora is not None:
            tensors = merge_adapters(base_weights(base_dir) | tensors, run.lora.scaling)
        if model_config.get("tie_word_embeddings"):
            tensors.pop("lm_head.weight", None)  # the embedding, loaded as the head
        snapshot = Snapshot({name: _cast(t, dtype) for name, t in split_experts(tensors).items()}, step, base_dir)
        for key in ("dtype", "torch_dtype"):  # what vLLM's and transformers' `dtype="auto"` pick
            if key in model_config or key == "dtype":
                model_config[key] = dtype_name
        snapshot.model_files["config.json"] = json.dumps(model_config, indent=2).encode()
    if isinstance(fs, LocalFileSystem):
        tmp = fresh_tmp(Path(out_path))
        snapshot.write_files(fs, str(tmp))
        return str(replace_dir(tmp, Path(out_path)))
    write_to_store(snapshot, fs, out_path)
    return out


def write_to_store(snapshot: Snapshot, fs: fsspec.AbstractFileSystem, path: str) -> None:
    """An object store has no rename: the earlier export is removed, then every file written,
    the config that makes the prefix a model directory (`config.json`, `adapter_config.json`)
    last, so an export killed midway leaves nothing that loads as a model."""
    if fs.exists(path):
        fs.rm(path, recursive=True)
    configs = {name: snapshot.model_files.pop(name) for name in MODEL_CONFIGS if name in snapshot.model_files}
    snapshot.write_files(fs, path)
    for name, data in configs.items():
        fs.pipe_file(f"{path}/{name}", data)


def load_run_config(config: ExportConfig) -> TrainerConfig | SFTConfig:
    """The run's trainer config (`config.config`, or the one its `configs/` holds)."""
    if config.config is not None:
        candidates = [config.config]
    else:
        candidates = [path for name in RUN_CONFIGS if (path := config.run / "configs" / name).is_file()]
        if not config.run.is_dir():
            raise ConfigError(f"run: {config.run} is not a directory (a run's output_dir)")
        if not candidates:
            raise ConfigError(f"run: {config.run} holds no configs/{' or configs/'.join(RUN_CONFIGS)} (the config "
                              "`rlkube rl` and `rlkube sft` write there); name the run's config with `config`")
    path = candidates[0]
    errors = []
    for name, model in RUN_CONFIGS.items():
        try:
            return load_config(model, ["@", str(path)])
        except ConfigError as e:
            errors.append(f"as {name}: {e}")
    raise ConfigError(f"config: {path} is neither an RL trainer's nor an SFT run's config ({'; '.join(errors)})")


def checkpoint_state(config: ExportConfig, run: TrainerConfig | SFTConfig) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, the trained tensors under the model's names) from the step's checkpoint."""
    root = checkpoint_root(config.run, run.ckpt)
    complete = complete_steps(root, (PROCESS,))
    step = config.step if config.step is not None else (complete[-1] if complete else None)
    if step is None:
        raise ConfigError(f"run: no complete checkpoint under {root} (a run saves one every `ckpt.interval` "
                          "steps and at its last step, when `ckpt` is set)")
    if step not in complete:
        fs, path = fsspec.core.url_to_fs(part_dir(root, step, PROCESS))
        why = f"has no {MARKER} marker: its save did not finish" if fs.exists(path) else "does not exist"
        raise ConfigError(f"step: {part_dir(root, step, PROCESS)} {why} (complete steps: {complete or 'none'})")
    return step, checkpoint_tensors(verified_part(root, step, PROCESS))


def checkpoint_tensors(part: str) -> dict[str, torch.Tensor]:
    """The model's tensors of a complete trainer part, whole, on CPU, under the model's names."""
    fs, path = fsspec.core.url_to_fs(part)
    url, prefix = (f"{part}/dcp", "model.") if fs.exists(f"{path}/dcp/.metadata") else (part, "app.model.")
    metadata = FsspecReader(url).read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)}
    with warnings.catch_warnings():  # DCP warns that it loads on one process, which is the point
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=FsspecReader(url), no_dist=True)
    return {key.removeprefix(prefix): tensor for key, tensor in state.items()}


def snapshot_state(config: ExportConfig, run: TrainerConfig | SFTConfig) -> tuple[int, dict[str, torch.Tensor]]:
    """(step, the policy's tensors under the model's names) from a storage-transport snapshot."""
    from rlkube.transport.weights_delta import ChainReader, PolicyReplica
    from rlkube.transport.weights_storage import list_steps

    if isinstance(run, SFTConfig):
        raise ConfigError("source: an SFT run's snapshots are its `weights/step_N` directories, already model "
                          "directories; export from its checkpoints (`source = \"checkpoint\"`)")
    if run.weights.type != "storage":
        raise ConfigError(f"source: the run's weights.type is {run.weights.type!r}, which leaves no snapshots; "
                          "export from its checkpoints (`source = \"checkpoint\"`)")
    root = run.weights.url or str(config.run / "weights")
    steps = list_steps(root)
    complete = sorted(step for step, done in steps.items() if done)
    step = config.step if config.step is not None else (complete[-1] if complete else None)
    if step is None or step not in complete:
        why = "is incomplete (no COMPLETE marker)" if step in steps else "does not exist"
        raise ConfigError(f"step: snapshot {step_dir(root, step if step is not None else 'N')} {why} "
                          f"(complete snapshots: {complete or 'none'})")
    reader = ChainReader(step_dir(root, step), timeout=0)
    tensors = PolicyReplica().update(reader.first(step), reader.read)
    return step, {name.removeprefix(PEFT_PREFIX): tensor for name, tensor in tensors.items()}


def base_weights(base_dir: Path) -> dict[str, torch.Tensor]:
    """The base model's weights, floating point in float32 as the trainer holds them."""
    from safetensors.torch import load_file

    weights = {}
    for file in sorted(base_dir.glob("*.safetensors")):
        weights.update({name: _cast(t, torch.float32) for name, t in load_file(file).items()})
    return weights


def check_out(fs: fsspec.AbstractFileSystem, out: str, base_dir: Path) -> None:
    """`out` is replaced whole: only a new directory or an earlier model directory may be."""
    fs.invalidate_cache()
    if not fs.exists(out):
        return
    if isinstance(fs, LocalFileSystem) and Path(out).resolve() == base_dir.resolve():
        raise ConfigError(f"out: {out} is the base model itself; name another directory")
    if not any(fs.isfile(f"{out}/{name}") for name in MODEL_CONFIGS):
        raise ConfigError(f"out: {fs.unstrip_protocol(out)} exists and is no model directory (an export replaces it whole); "
                          "name a new directory")


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.is_floating_point() else tensor
