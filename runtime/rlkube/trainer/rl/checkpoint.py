"""The RL trainer's part of a run checkpoint: `<ckpt root>/trainer/step_N/`.

Sharded model and optimizer state via `torch.distributed.checkpoint` (each rank writes its
shards; loads reshard to any world size), plus the scheduler and the step in `progress.json`.
The root is a path or an fsspec URL (`ckpt.url`); every rank writes its shards straight into
`trainer/step_N/dcp/`, and rank 0 writes the `COMPLETE` marker only once DCP's metadata (the
last thing `dcp.save` writes, after every rank's shards) and `progress.json` are there (see
rlkube.checkpoints), so a run killed mid-save resumes from the previous checkpoint,
never from a torn one.

The save/load mechanics are shared with SFT's CheckpointManager (rlkube.trainer.ckpt); what
differs is that an RL step also holds the orchestrator's part, written by another process, so
`latest` needs both parts complete.
"""

import json
import logging
from pathlib import Path

from rlkube.checkpoints import part_dir, resolve_resume_step, unmark_after
from rlkube.config import CheckpointConfig
from rlkube.trainer.ckpt import load_part, save_part, set_trainable_state, trainable_state

logger = logging.getLogger(__name__)

PROCESS = "trainer"


class TrainerCheckpointer:
    def __init__(self, root: Path | str, config: CheckpointConfig, rank: int):
        self.root = str(root)
        self.config = config
        self.rank = rank

    def resolve(self, resume_step: int | str | None) -> int | None:
        """`ckpt.resume_step` as the step to load (None: start fresh). Every rank resolves it
        before any rank changes a marker (loading is collective), so all agree."""
        return resolve_resume_step(self.root, resume_step, PROCESS)

    def save(self, step: int, model, optimizer, scheduler) -> str:
        """Collective: every rank calls it. Returns the part's URL."""
        model_state, optim_state = trainable_state(model, optimizer)
        progress = {"step": step, "scheduler": scheduler.state_dict()}
        path = save_part(self.root, step, PROCESS, {"model": model_state, "optimizer": optim_state},
                         {"progress.json": json.dumps(progress).encode()},
                         is_main=self.rank == 0, config=self.config, dcp_dir="dcp")
        logger.info("saved checkpoint %s", path)
        return path

    def load(self, step: int, model, optimizer, scheduler) -> int:
        """Collective: restore model, optimizer and scheduler of a complete step; returns it."""
        model_state, optim_state = trainable_state(model, optimizer)
        state = {"model": model_state, "optimizer": optim_state}
        files = load_part(self.root, step, PROCESS, state, ("progress.json",), dcp_dir="dcp")
        set_trainable_state(model, optimizer, state["model"], state["optimizer"])
        progress = json.loads(files["progress.json"])
        scheduler.load_state_dict(progress["scheduler"])
        logger.info("loaded checkpoint %s", part_dir(self.root, step, PROCESS))
        return int(progress["step"])

    def abandon_after(self, step: int) -> None:
        """A run resumed from `step` abandons the later steps: unmark their trainer parts."""
        if self.rank == 0:
            unmark_after(self.root, step, PROCESS)
