"""The pool trainer's loop: rank 0 plans (rlkube.trainer.pool.roster), every rank does the
plan, one member's step at a time.

    loop = PoolLoop(multi_run_trainer, roster_on_rank_0_else_None, credential_of)
    loop.run()                       # until roster.stop()

A member's failure fails that member alone: an error while adding it or training its step (a
bad batch, a loss that is not finite, its orchestrator gone or restarted) removes it (its
adapter and optimizer freed), is recorded with the reason, and the loop goes on with the
others. Such an error must happen on every rank alike (a batch's content, the reduced gradient
norm), as it does for the ones named; a rank failing alone blocks the others in the next
collective until the peer timeout, and the gang restarts, every member from its checkpoint.
"""

import json
import logging
import os
import time
from pathlib import Path

import torch.distributed as dist

from rlkube.config import TrainerConfig
from rlkube.trainer.pool.roster import Plan
from rlkube.trainer.rl.run_io import RunIO, open_run_io

logger = logging.getLogger(__name__)

IDLE_S = 0.05
"""Rank 0's pause between plans when no member's batch is ready."""


class PoolLoop:
    def __init__(self, pool, roster, credential_of, unavailable_s: float, status_path: Path | None = None):
        """`pool`: MultiRunTrainer; `roster`: rank 0's Roster (None on the other ranks);
        `credential_of(member)`: the rollouts credential of its orchestrator; `unavailable_s`:
        how long a fetch retries an orchestrator that is gone (`pool.fetch_unavailable_s`);
        `status_path`: where rank 0 keeps the roster's status as JSON."""
        self.pool, self.roster, self.credential_of, self.status_path = pool, roster, credential_of, status_path
        self.unavailable_s = unavailable_s
        self.rank, self.world_size = pool.info.rank, pool.info.world_size
        self.ios: dict[str, RunIO] = {}

    def run(self) -> None:
        while True:
            plan = self.broadcast(self.roster.plan() if self.rank == 0 else None)
            if plan.stop:
                return
            self.apply(plan)
            if self.rank == 0:
                if plan.leaves or plan.joins or plan.train:
                    self.write_status()
                if not plan.train:
                    time.sleep(IDLE_S)

    def broadcast(self, plan: Plan | None) -> Plan:
        if self.world_size == 1:
            return plan
        box = [plan]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def apply(self, plan: Plan) -> None:
        for name, reason in plan.leaves:
            self.leave(name, reason)
        for name, config in plan.joins:
            self.isolated(name, self.join, name, TrainerConfig.model_validate_json(config))
        for name in plan.train:
            self.isolated(name, self.train, name)

    def join(self, name: str, config: TrainerConfig) -> None:
        io = open_run_io(config, self.rank, self.credential_of(name), self.unavailable_s)
        try:
            member = self.pool.add_run(name, config, io.client, io.publisher, io.checkpointer, io.metrics)
        except BaseException:
            io.close()
            raise
        self.ios[name] = io
        if member.step == 0:  # its step-0 adapter (LoRA's B = 0: the base model's outputs), for its
            with self.pool.active(member):  # orchestrator to name in every request before policy 1
                member.trainer.publish_policy(0, resumed=True)
        if self.roster:
            self.roster.joined(name, member.step)

    def train(self, name: str) -> None:
        self.pool.train_step([name])
        member = self.pool.members[name]
        if self.roster:
            self.roster.trained(name, member.step, member.trainer.trained_tokens)
        if member.finished:
            self.leave(name, "finished", abandon=False)
            if self.roster:
                self.roster.gone(name, "finished")

    def isolated(self, name: str, fn, *args) -> None:
        """`fn(*args)`; an error in it fails member `name` alone."""
        try:
            fn(*args)
        except Exception as e:
            logger.exception("member %s failed; the pool goes on without it", name)
            reason = f"failed: {type(e).__name__}: {e}"
            self.leave(name, reason)
            if self.roster:
                self.roster.gone(name, reason)

    def leave(self, name: str, reason: str, abandon: bool = True) -> None:
        """Remove member `name`, if it is one. Its publish in flight is finished, but with
        `abandon` (it failed, detached, or its orchestrator is gone) not reported: its client is
        closed first, so that no report waits out its timeout on an orchestrator that is gone."""
        try:
            if abandon and name in self.ios:
                self.ios[name].client.close()
            if name in self.pool.members:
                self.pool.remove_run(name)
        except Exception:
            logger.log(logging.INFO if abandon else logging.ERROR, "member %s: its last publish failed", name,
                       exc_info=True)
        finally:
            if io := self.ios.pop(name, None):
                io.close()
        logger.info("member %s removed: %s", name, reason)

    def write_status(self) -> None:
        if self.status_path is None:
            return
        self.status_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.status_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.roster.status(), indent=1))
        os.replace(tmp, self.status_path)

    def close(self) -> None:
        for name in list(self.pool.members):
            self.leave(name, "the pool trainer stops")
