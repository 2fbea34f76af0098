"""A pool member's orchestrator and the pool trainer (`orchestrator.pool`): attaching at start,
staying a member, detaching at the end.

The orchestrator attaches itself with its own trainer config (`pool.trainer_config`), told to
resume from the step this orchestrator resumes from, so both halves of the member restart
from the same checkpoint. Then every `pool.check_interval_s` it asks the pool trainer whether
it still is a member (`Pool.Status`): the pool trainer keeps its roster in memory, so one that
restarted (a gang restart) knows it no more, and neither does one that evicted it. The
orchestrator then starts over from its own newest checkpoint and attaches again (`PoolLost`,
which `rlkube.orchestrator.app.serve` handles). A member the pool trainer failed (a loss that is
not finite, a batch with nothing to train) fails: attaching again would fail the same way.
"""

import asyncio
import logging
import time

from rlkube.config import OrchestratorConfig, TrainerConfig, load_config
from rlkube.transport import pool as pool_rpc

logger = logging.getLogger(__name__)

FINISHED = "finished"
DETACH_TIMEOUT_S = 10.0


class PoolLost(RuntimeError):
    """The pool trainer no longer holds this member (it restarted, or evicted it)."""


class Membership:
    def __init__(self, config: OrchestratorConfig):
        self.config = config
        self.pool = config.pool
        self.address = self.pool.address or f"{config.rollouts.host}:{config.rollouts.port}"

    def trainer_config(self, resume_step: int | None) -> str:
        """The member's trainer config as JSON, resuming from `resume_step` (None: fresh)."""
        path = str(self.pool.trainer_config)
        try:
            trainer = load_config(TrainerConfig, ["@", path])
        except ValueError as e:
            raise ValueError(f"pool.trainer_config: {e}") from None
        if trainer.max_steps != self.config.max_steps:
            raise ValueError(f"pool.trainer_config: {path} has max_steps {trainer.max_steps}, this orchestrator "
                             f"{self.config.max_steps}: the two halves of a member train the same steps")
        if trainer.ckpt is None:
            if resume_step is not None:
                raise ValueError(f"pool.trainer_config: {path} sets no ckpt, but this orchestrator resumes from its "
                                 f"checkpoint {resume_step}: the pool trainer would have none of the member's to match")
            return trainer.model_dump_json()
        return trainer.model_copy(update={"ckpt": trainer.ckpt.model_copy(update={"resume_step": resume_step})}
                                  ).model_dump_json()

    async def attach(self, resume_step: int | None) -> str:
        """Attach (retrying up to `pool.attach_timeout_s` while the pool trainer does not
        answer); returns where its step-0 adapter is published."""
        config = self.trainer_config(resume_step)
        location = await asyncio.to_thread(pool_rpc.attach, self.pool.trainer, self.pool.member, self.address, config,
                                           self.pool.weight, self.pool.attach_timeout_s)
        logger.info("attached to the pool trainer %s as member %s, resuming from step %s (Rollouts at %s)",
                    self.pool.trainer, self.pool.member, resume_step or 0, self.address)
        return location

    async def watch(self) -> None:
        """Until the pool trainer says it trained the member to its end; `PoolLost` once it does
        not know the member (or did not answer for `pool.attach_timeout_s`: RuntimeError),
        RuntimeError when it failed it."""
        member, answered = self.pool.member, time.monotonic()
        while True:
            await asyncio.sleep(self.pool.check_interval_s)
            try:
                status = await asyncio.to_thread(pool_rpc.status, self.pool.trainer, member, self.pool.check_interval_s)
            except pool_rpc.PoolUnavailable as e:
                if time.monotonic() - answered > self.pool.attach_timeout_s:
                    raise RuntimeError(f"the pool trainer did not answer for pool.attach_timeout_s "
                                       f"({self.pool.attach_timeout_s:g}s): {e}") from None
                logger.info("the pool trainer does not answer (restarting?): %s", e)
                continue
            answered = time.monotonic()
            if any(m.name == member for m in status.members):
                continue
            reason = status.left.get(member)
            if reason == FINISHED:
                return
            if reason is not None and reason.startswith("failed"):
                raise RuntimeError(f"the pool trainer failed member {member}: {reason}")
            raise PoolLost(f"the pool trainer no longer holds member {member}: "
                           f"{reason or 'it does not know it (it restarted)'}")

    async def while_member(self, run) -> None:
        """Await the coroutine `run` (the orchestrator's run) while watching the membership."""
        task, watch = asyncio.ensure_future(run), asyncio.ensure_future(self.watch())
        try:
            done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch in done and watch.exception() is not None:
                raise watch.exception()
            await task
        finally:
            for t in (task, watch):
                t.cancel()
            await asyncio.gather(task, watch, return_exceptions=True)

    async def detach(self) -> None:
        """Leave the pool (its adapter and optimizer freed at once, not after the eviction grace)."""
        try:
            was = await asyncio.to_thread(pool_rpc.detach, self.pool.trainer, self.pool.member, DETACH_TIMEOUT_S)
        except ValueError as e:
            logger.warning("could not detach member %s from the pool trainer: %s", self.pool.member, e)
            return
        if was:
            logger.info("detached member %s from the pool trainer %s", self.pool.member, self.pool.trainer)
