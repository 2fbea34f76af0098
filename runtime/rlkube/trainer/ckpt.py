"""Trainer checkpoints with torch.distributed.checkpoint (DCP), never left half-written.

Layout: `<output_dir>/checkpoints/step_N/trainer/` holds the sharded model, optimizer and
scheduler state (DCP files) plus `train_state.json` (step, data position: anything JSON-like).

Why a checkpoint is either complete or invisible: every rank writes into
`checkpoints/.step_N.tmp/`; DCP writes its `.metadata` file last, after all ranks' shards;
then rank 0 renames the directory to `step_N` (an atomic rename on one filesystem). A
process killed mid-save leaves only a `.tmp` directory, which resume never reads and the
next save removes. Resume (`ckpt.resume_step`: N or "latest") only considers `step_N`
directories whose `trainer/.metadata` exists.
"""

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from rlkube.config import CheckpointConfig
from rlkube.logs import get_logger

logger = get_logger(__name__)

_STEP_DIR = re.compile(r"^step_(\d+)$")


class _AppState(Stateful):
    """Model + optimizer + scheduler, as one DCP Stateful."""

    def __init__(self, model: nn.Module, optimizer, scheduler) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_sd,
            "optimizer": optim_sd,
            "scheduler": self.scheduler.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state_dict["model"], optim_state_dict=state_dict["optimizer"]
        )
        self.scheduler.load_state_dict(state_dict["scheduler"])


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step}"


def is_complete(step_dir: Path) -> bool:
    return (step_dir / "trainer" / ".metadata").is_file()


def complete_steps(output_dir: Path) -> list[int]:
    """Steps with a complete checkpoint, ascending."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for child in root.iterdir():
        if (m := _STEP_DIR.match(child.name)) and is_complete(child):
            steps.append(int(m.group(1)))
    return sorted(steps)


def steps_to_delete(steps: list[int], keep_last: int | None, keep_interval: int | None) -> list[int]:
    """Which checkpoints pruning removes: all but the newest `keep_last`, except multiples
    of `keep_interval`."""
    if keep_last is None:
        return []
    kept = set(sorted(steps)[-keep_last:])
    return [s for s in steps if s not in kept and not (keep_interval and s % keep_interval == 0)]


class CheckpointManager:
    """Save, resume and prune trainer checkpoints under `<output_dir>/checkpoints/`."""

    def __init__(self, output_dir: Path, config: CheckpointConfig, *, is_main: bool) -> None:
        self.output_dir = Path(output_dir)
        self.config = config
        self.is_main = is_main

    def should_save(self, step: int, last_step: int) -> bool:
        return step == last_step or (self.config.interval is not None and step % self.config.interval == 0)

    def save(self, step: int, model: nn.Module, optimizer, scheduler, train_state: dict[str, Any]) -> Path:
        """Collective: every rank calls it. Returns the final `step_N` directory."""
        final = checkpoint_dir(self.output_dir, step)
        tmp = final.with_name(f".{final.name}.tmp")
        if self.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        dcp.save({"app": _AppState(model, optimizer, scheduler)}, checkpoint_id=tmp / "trainer")
        if self.is_main:
            (tmp / "trainer" / "train_state.json").write_text(json.dumps(train_state))
        dist.barrier()
        if self.is_main:
            if final.exists():  # re-saving a step (after a resume): replace it whole
                stale = final.with_name(f".{final.name}.old")
                shutil.rmtree(stale, ignore_errors=True)
                final.rename(stale)
                shutil.rmtree(stale)
            tmp.rename(final)
            self._prune()
            logger.info(f"saved checkpoint {final}")
        dist.barrier()
        return final

    def resolve_resume_step(self) -> int | None:
        """The step to resume from, per `resume_step`; None starts fresh."""
        wanted = self.config.resume_step
        if wanted is None:
            return None
        steps = complete_steps(self.output_dir)
        if wanted == "latest":
            return steps[-1] if steps else None
        if wanted not in steps:
            raise ValueError(
                f"ckpt.resume_step: no complete checkpoint for step {wanted} under "
                f"{self.output_dir / 'checkpoints'} (complete: {steps or 'none'})"
            )
        return wanted

    def load(self, step: int, model: nn.Module, optimizer, scheduler) -> dict[str, Any]:
        """Collective: restore model, optimizer and scheduler in place; returns the train state."""
        path = checkpoint_dir(self.output_dir, step) / "trainer"
        dcp.load({"app": _AppState(model, optimizer, scheduler)}, checkpoint_id=path)
        logger.info(f"resumed from checkpoint step {step}")
        return json.loads((path / "train_state.json").read_text())

    def _prune(self) -> None:
        steps = complete_steps(self.output_dir)
        for step in steps_to_delete(steps, self.config.keep_last, self.config.keep_interval):
            shutil.rmtree(checkpoint_dir(self.output_dir, step))
            logger.info(f"pruned checkpoint step {step}")
