"""Trainer checkpoints with torch.distributed.checkpoint (DCP), never counted half-written.

Layout: `<ckpt root>/trainer/step_N/` (the root is `ckpt.url`, a path or an fsspec URL such as
`s3://bucket/run/checkpoints`, or `<output_dir>/checkpoints`) holds the sharded model,
optimizer and scheduler state (DCP files) plus `train_state.json` (step, data position:
anything JSON-like).

Why a checkpoint is either complete or invisible: object stores have no atomic rename, so a
part counts only once its `COMPLETE` marker exists (rlkube.checkpoints). Every rank
writes its shards straight into the part, DCP writes its `.metadata` after all ranks' shards,
then rank 0 writes the JSON files and, last, the marker. A process killed mid-save leaves a
part without a marker, which resume never picks and the next save of that step replaces
(removing the marker first). Checkpoints written before the marker rule (a `.metadata`
and no `COMPLETE`) are not picked: `touch trainer/step_N/COMPLETE` makes one resumable.

Why a part is signed: DCP reads `.metadata` with `pickle`, so a file planted in the part runs
code in the trainer. Rank 0 writes `MANIFEST.json` (every file's size and SHA-256, HMAC-signed
with the run's checkpoint key: rlkube.manifest) just before the marker, and a load checks it
before DCP opens anything; the ranks hash the files between them. A refused part stops the run
(`manifest.Refused`: the entry points exit 2 naming the file) rather than resuming from an older
step, which the orchestrator, resolving `latest` on its own, would not follow.

`save_part`/`load_part` are the mechanics the RL trainer's part shares (rlkube.trainer.rl.checkpoint).
"""

import json
from pathlib import Path
from typing import Any

import fsspec
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from rlkube import manifest
from rlkube.checkpoints import (
    MARKER,
    begin_part,
    checkpoint_root,
    finish_part,
    is_complete,
    part_dir,
    prune,
    resolve_resume_step,
)
from rlkube.config import CheckpointConfig
from rlkube.logs import get_logger

logger = get_logger(__name__)

PROCESS = "trainer"


def trainable_state(model: nn.Module, optimizer) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state to checkpoint. Frozen parameters (a LoRA run's base model)
    are left out: they are the unchanged `model.name` weights the model is built from. (DCP's
    `ignore_frozen_params` alone keeps a frozen weight tied to another one: lm_head.)"""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=True))
    frozen = {name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return {k: v for k, v in model_sd.items() if k not in frozen}, optim_sd


def set_trainable_state(model: nn.Module, optimizer, model_sd: dict[str, Any], optim_sd: dict[str, Any]) -> None:
    """Load what `trainable_state` saved (a model with frozen parameters keeps its own)."""
    frozen = any(not p.requires_grad for p in model.parameters())
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd,
                   options=StateDictOptions(strict=not frozen))


class _AppState(Stateful):
    """Model + optimizer + scheduler, as one DCP Stateful."""

    def __init__(self, model: nn.Module, optimizer, scheduler) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = trainable_state(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_trainable_state(self.model, self.optimizer, state_dict["model"], state_dict["optimizer"])
        self.scheduler.load_state_dict(state_dict["scheduler"])


def save_part(root: str, step: int, process: str, state: dict[str, Any], files: dict[str, bytes], *,
              is_main: bool, config: CheckpointConfig, dcp_dir: str = "") -> str:
    """Collective: write `state` with DCP (every rank its shards) and `files` into `process`'s
    part of step `step`, mark it complete, prune per `config`. Returns the part's URL."""
    if is_main:
        begin_part(root, step, process)  # unmarked before anything is overwritten
    _barrier()
    url = part_dir(root, step, process)
    dcp.save(state, storage_writer=FsspecWriter(f"{url}/{dcp_dir}" if dcp_dir else url))
    _barrier()  # every rank's shards and DCP's metadata are written
    digests = _digests(url, _broadcast(manifest.part_files(url, _UNLISTED) if is_main else None))
    if is_main:
        listed = digests | {name: manifest.digest_bytes(data) for name, data in files.items()}
        signed = manifest.manifest_bytes(listed, _place(step, process), manifest.checkpoint_key())
        finish_part(root, step, process, files | {manifest.MANIFEST: signed})  # the manifest last, then the marker
        for pruned in prune(root, process, config.keep_last, config.keep_interval):
            logger.info(f"pruned checkpoint step {pruned}")
    _barrier()
    return url


def load_part(root: str, step: int, process: str, state: dict[str, Any], names: tuple[str, ...], *,
              dcp_dir: str = "") -> dict[str, bytes]:
    """Collective: load `state` in place from a complete part; returns the files `names`."""
    if not is_complete(root, step, process):
        raise FileNotFoundError(f"ckpt.resume_step: {part_dir(root, step, process)} is not a complete checkpoint")
    url = verified_part(root, step, process)
    dcp.load(state, storage_reader=FsspecReader(f"{url}/{dcp_dir}" if dcp_dir else url))
    fs, path = fsspec.core.url_to_fs(url)
    return {name: fs.cat_file(f"{path}/{name}") for name in names}


_UNLISTED = (MARKER, manifest.MANIFEST)


def _place(step: int, process: str) -> str:
    return f"{process}/step_{step}"


def verified_part(root: str, step: int, process: str) -> str:
    """The URL of `process`'s part of step `step`, once `verify_part` passed: call it before DCP
    unpickles the part's metadata (a load, an export)."""
    url = part_dir(root, step, process)
    verify_part(url, _place(step, process))
    return url


def verify_part(url: str, place: str) -> None:
    """Collective: `manifest.Refused` on every rank unless the part's files are those its
    manifest lists, signed with the run's key (rlkube.manifest; no key: hashes only)."""
    listed = manifest.read_manifest(url, place, manifest.checkpoint_key())
    if listed is None:
        return
    present = _broadcast(manifest.part_files(url, _UNLISTED) if _rank() == 0 else None)
    digests = _digests(url, [name for name in present if name in listed])
    manifest.check_files(url, listed, present, digests)


def _digests(url: str, names: list[str]) -> dict[str, dict]:
    """Collective: the digests of `names`, each rank hashing a share."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    mine = manifest.digest_files(url, names[_rank()::world])
    if world == 1:
        return mine
    shares: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(shares, mine)
    return {name: d for share in shares for name, d in share.items()}


def _broadcast(value):
    """Collective: rank 0's `value` on every rank."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


class CheckpointManager:
    """Save, resume and prune SFT checkpoints under `ckpt.url` or `<output_dir>/checkpoints/`."""

    def __init__(self, output_dir: Path, config: CheckpointConfig, *, is_main: bool) -> None:
        self.root = checkpoint_root(output_dir, config)
        self.config = config
        self.is_main = is_main

    def should_save(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.config.interval is not None and step % self.config.interval == 0)

    def save(self, step: int, model: nn.Module, optimizer, scheduler, train_state: dict[str, Any]) -> str:
        """Collective: every rank calls it. Returns the URL of `trainer/step_N`."""
        files = {"train_state.json": json.dumps(train_state).encode()}
        path = save_part(self.root, step, PROCESS, {"app": _AppState(model, optimizer, scheduler)}, files,
                         is_main=self.is_main, config=self.config)
        if self.is_main:
            logger.info(f"saved checkpoint {path}")
        return path

    def resolve_resume_step(self) -> int | None:
        """The step to resume from, per `resume_step`; None starts fresh."""
        return resolve_resume_step(self.root, self.config.resume_step, PROCESS, (PROCESS,))

    def load(self, step: int, model: nn.Module, optimizer, scheduler) -> dict[str, Any]:
        """Collective: restore model, optimizer and scheduler in place; returns the train state."""
        state = {"app": _AppState(model, optimizer, scheduler)}
        files = load_part(self.root, step, PROCESS, state, ("train_state.json",))
        logger.info(f"resumed from checkpoint step {step}")
        return json.loads(files["train_state.json"])
