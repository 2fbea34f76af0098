"""The RL trainer's part of a run checkpoint: `<output_dir>/checkpoints/step_N/trainer/`.

Sharded model and optimizer state via `torch.distributed.checkpoint` (each rank writes its
shards; loads reshard to any world size), plus the scheduler and the step. Every rank writes
into `step_N/.trainer.tmp/`; rank 0 renames it to `step_N/trainer/` and then writes the
`COMPLETE` marker (see rlkube.launch.checkpoints), so a run killed mid-save resumes from the
previous checkpoint, never from a torn one.

Not rlkube.trainer.ckpt.CheckpointManager (SFT's): that one owns the whole `step_N/`
directory (renames and prunes it whole), while an RL step directory is shared with the
orchestrator's part, which is written concurrently by another process.
"""

import json
import logging
import shutil
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from rlkube.config import CheckpointConfig
from rlkube.launch.checkpoints import MARKER, complete_steps, is_complete, part_dir, unmark_after

logger = logging.getLogger(__name__)

PROCESS = "trainer"


class TrainerCheckpointer:
    def __init__(self, root: Path, config: CheckpointConfig, rank: int):
        self.root = Path(root)
        self.config = config
        self.rank = rank

    def save(self, step: int, model, optimizer, scheduler) -> Path:
        path = part_dir(self.root, step, PROCESS)
        tmp = path.with_name(f".{PROCESS}.tmp")
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)  # a torn save from a killed run
            tmp.mkdir(parents=True)
        _barrier()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp / "dcp"))
        _barrier()
        if self.rank == 0:
            progress = {"step": step, "scheduler": scheduler.state_dict()}
            (tmp / "progress.json").write_text(json.dumps(progress))
            shutil.rmtree(path, ignore_errors=True)  # re-saving a step after a resume
            tmp.rename(path)
            (path / MARKER).touch()
            self.prune(step)
        _barrier()
        logger.info("saved checkpoint %s", path)
        return path

    def load(self, step: int, model, optimizer, scheduler) -> int:
        if not is_complete(self.root, step, PROCESS):
            raise FileNotFoundError(f"ckpt.resume_step: no complete trainer checkpoint at {part_dir(self.root, step, PROCESS)}")
        path = part_dir(self.root, step, PROCESS)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        dcp.load(state, checkpoint_id=str(path / "dcp"))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        progress = json.loads((path / "progress.json").read_text())
        scheduler.load_state_dict(progress["scheduler"])
        return int(progress["step"])

    def abandon_after(self, step: int) -> None:
        """A run resumed from `step` abandons the later steps: unmark their trainer parts."""
        if self.rank == 0:
            unmark_after(self.root, step, PROCESS)

    def prune(self, newest: int) -> None:
        """Keep the newest `keep_last` trainer parts (and multiples of `keep_interval`)."""
        if self.config.keep_last is None:
            return
        steps = [s for s in complete_steps(self.root, (PROCESS,)) if s <= newest]
        for step in steps[: -self.config.keep_last]:
            if self.config.keep_interval and step % self.config.keep_interval == 0:
                continue
            shutil.rmtree(part_dir(self.root, step, PROCESS), ignore_errors=True)
            try:
                part_dir(self.root, step, PROCESS).parent.rmdir()  # only if the orchestrator's part is gone too
            except OSError:
                pass


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()

