"""The orchestrator: rollouts in, batches out, one policy clock in between.

It owns the pieces and the protocol with the trainer (the `BatchSource` the gRPC server
serves):

- the scheduler generates groups within the clock's limits and cuts batch after batch, running
  them here or in env workers (`orchestrator.env_workers`, rlkube.orchestrator.workers);
- `get_batch(step, rank, world_size)` packs a cut batch for the trainer's world size (once
  per step) and answers each rank with its rows;
- `report_policy(step, location)` queues policy `step`; the policy loop pauses every replica,
  loads it, resumes, advances the clock, then checkpoints and evaluates when due.

Batches are kept until the trainer reports the policy they produced (it consumed them).
"""

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable

from rlkube.checkpoints import checkpoint_root, unmark_after
from rlkube.config import OrchestratorConfig
from rlkube.histogram import Histogram
from rlkube.inference.client import InferenceError
from rlkube.orchestrator import checkpoint
from rlkube.orchestrator.advantage import make_advantage_fn
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.clock import PolicyClock
from rlkube.orchestrator.eval import EVAL_REWARD
from rlkube.orchestrator.metrics import batch_metrics, truncation_warning
from rlkube.orchestrator.packing import pack_batch
from rlkube.orchestrator.rollouts import Reissuer, run_group
from rlkube.orchestrator.scheduler import Scheduler
from rlkube.orchestrator.teacher import Teacher, scored_by
from rlkube.orchestrator.types import Batch
from rlkube.orchestrator.workers import WorkerHub
from rlkube.rollout_types import Rollout

logger = logging.getLogger(__name__)

RESUMED_POLICY_RETRY_S = 2.0
MetricsFn = Callable[[dict[str, float], int], None]
EvalFn = Callable[[int], Awaitable[dict[str, float]]]


class Orchestrator:
    def __init__(self, config: OrchestratorConfig, runners: list, pool, log_metrics: MetricsFn, evaluate: EvalFn | None = None,
                 log_samples: Callable[[Batch], None] | None = None, judge=None):
        self.config = config
        self.judge = judge
        """The judge's endpoint (`rlkube.orchestrator.judge`), metered each step; None without one."""
        self.log_samples = log_samples
        """Every batch as text, where `orchestrator.samples_interval` asks for it (`rlkube.orchestrator.samples`)."""
        self.instance_id = uuid.uuid4().hex
        """Random per process; every answer to the trainer carries it, so a trainer that
        reaches a restarted orchestrator stops (`rlkube.transport.client.OrchestratorRestarted`)."""
        self.runners = {r.name: r for r in runners}
        self.pool = pool
        self.log_metrics = log_metrics
        self.evaluate = evaluate
        self.clock = PolicyClock(config.async_level)
        self.buffer = RolloutBuffer(config.batch_size, config.max_off_policy_steps, config.min_batch_samples,
                                    config.drops_zero_advantage, config.off_policy_drop)
        self.workers = (
            WorkerHub(self.clock, config.group_size, list(self.runners), config.env_worker_timeout_s,
                      lambda: self.pool.request_model)
            if config.env_workers else None
        )
        """Groups go to env worker processes (served on the gRPC port) instead of running here."""
        self.teacher = Teacher(config.teacher) if config.teacher else None
        """On-policy distillation: scores each group's samples once they are final."""
        self.reissuer = Reissuer(self.workers.run_group if self.workers else self.run_group,
                                 config.client.resync_interval_s)
        """Rollouts that lost their inference replica run again, here or in the workers."""
        self.reissued_logged = 0
        self.skipped_logged = 0
        run_group = self.reissuer
        self.scheduler = Scheduler(
            runners=runners,
            ratios=[r.config.ratio for r in runners],
            run_group=scored_by(self.teacher, run_group) if self.teacher else run_group,
            clock=self.clock,
            buffer=self.buffer,
            advantage_fn=make_advantage_fn(config.advantage, config.sampling.max_tokens),
            group_size=config.group_size,
            max_steps=config.max_steps,
            max_groups_in_flight=config.max_groups_in_flight,
            on_batch=self.on_batch,
            seed=config.seed,
            over_provision=config.over_provision,
        )
        self.batches: dict[int, Batch] = {}
        self.batch_ready: dict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.packed: dict[int, tuple[int, int, asyncio.Future]] = {}
        """step -> (world_size, micro_batch_rows, packing of its batch: per rank, micro-batches)."""
        self.reports: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
        self.finished = asyncio.Event()
        self.phase = "starting"
        self.policy_location: str | None = None
        self.newest_batch_step = 0
        self.trained_step = 0
        """The newest step the trainer finished (reported its policy); /status's `step`."""
        self.last_reward: float | None = None
        self.last_eval_reward: float | None = None
        self.last_lag = 0
        self.warned_truncation = False
        self.last_checkpoint_step: int | None = None
        self.checkpoints_dir = checkpoint_root(config.output_dir, config.ckpt)
        self.batch_started = time.perf_counter()

    # --- rollouts -------------------------------------------------------------------

    async def run_group(self, runner, example_id: str, task, size: int) -> list[Rollout]:
        """`size` rollouts of a task in this process (no env workers)."""
        return await run_group(
            runner, self.pool, example_id, task, size, self.config.sampling.temperature, lambda: self.clock.policy_step,
        )

    def on_batch(self, batch: Batch) -> None:
        metrics = self.store_batch(batch)
        metrics["rollouts/reissued"] = float(self.reissuer.reissued - self.reissued_logged)
        metrics["rollouts/in_flight"] = float(len(self.scheduler.in_flight) * self.config.group_size)
        metrics["rollouts/stragglers"] = float(self.scheduler.straggler_rollouts())
        self.reissued_logged = self.reissuer.reissued
        metrics |= self.pool.metrics()
        if self.judge is not None:
            metrics |= self.judge.metrics()
        if self.config.difficulty is not None:
            metrics |= self.difficulty_metrics()
        if self.workers is not None:
            metrics |= self.workers.metrics()
        metrics["time/batch"] = time.perf_counter() - self.batch_started
        self.batch_started = time.perf_counter()
        self.log_metrics(metrics, batch.step)
        if self.log_samples is not None:
            self.log_samples(batch)

    def difficulty_metrics(self) -> dict[str, float]:
        """`tasks/easy` and `tasks/hard`: the tasks labelled so now, over all envs;
        `tasks/skipped`: turns skipped since the previous batch (`orchestrator.difficulty`)."""
        samplers = [runner.sampler for runner in self.runners.values()]
        labels = [label for sampler in samplers for label in sampler.labels.values()]
        skipped = sum(sampler.skipped for sampler in samplers)
        metrics = {"tasks/easy": float(labels.count("easy")), "tasks/hard": float(labels.count("hard")),
                   "tasks/skipped": float(skipped - self.skipped_logged)}
        self.skipped_logged = skipped
        return metrics

    def store_batch(self, batch: Batch) -> dict[str, float]:
        metrics = batch_metrics(batch, self.config.drops_zero_advantage)
        self.batches[batch.step] = batch
        self.newest_batch_step = max(self.newest_batch_step, batch.step)
        self.last_reward = metrics.get("reward/all/mean")
        self.last_lag = int(metrics.get("off_policy/lag/max", 0))
        if not self.warned_truncation and (warning := truncation_warning(metrics, self.config.sampling.max_tokens)):
            logger.warning("step %d: %s", batch.step, warning)  # once a run: the metric is_truncated goes on
            self.warned_truncation = True
        self.batch_ready[batch.step].set()
        return metrics

    # --- the trainer's side (BatchSource) -------------------------------------------

    async def get_batch(self, step: int, rank: int, world_size: int, micro_batch_rows: int) -> list[dict]:
        if not 1 <= step <= self.config.max_steps:
            raise LookupError(f"step {step} is outside 1..max_steps ({self.config.max_steps})")
        if world_size < 1 or not 0 <= rank < world_size or micro_batch_rows < 1:
            raise ValueError(f"bad request: rank {rank}, world_size {world_size}, micro_batch_rows {micro_batch_rows}")
        if step <= self.clock.policy_step:
            raise LookupError(f"batch {step} was already consumed (policy {self.clock.policy_step} is loaded)")
        await self.batch_ready[step].wait()
        if step not in self.packed:  # the first rank to ask packs for all (off the event loop)
            samples = self.batches[step].samples(self.config.drops_zero_advantage)
            packing = asyncio.to_thread(
                pack_batch, samples, self.config.seq_len, world_size, micro_batch_rows, self.config.share_prompts
            )
            self.packed[step] = (world_size, micro_batch_rows, asyncio.ensure_future(packing))
        packed_world, packed_rows, packing = self.packed[step]
        ranks = await asyncio.shield(packing)
        if (packed_world, packed_rows) != (world_size, micro_batch_rows):
            raise ValueError(
                f"step {step} was packed for world_size {packed_world} and micro_batch_rows {packed_rows}; "
                f"got {world_size} and {micro_batch_rows}"
            )
        return ranks[rank]

    async def report_policy(self, step: int, location: str) -> int:
        if not self.clock.policy_step <= step <= self.config.max_steps:
            raise ValueError(f"policy {step} is not in {self.clock.policy_step}..max_steps ({self.config.max_steps})")
        if step > self.newest_batch_step:
            raise ValueError(f"policy {step} reported before batch {step} was served")
        self.trained_step = max(self.trained_step, step)
        await self.reports.put((step, location))
        return step

    def current_policy(self) -> tuple[int, str | None]:
        """The policy inference must serve: step and where its weights are (None: the base model)."""
        return self.clock.policy_step, self.policy_location

    def status(self) -> dict:
        return {
            "phase": self.phase,
            "step": self.trained_step,
            "max_steps": self.config.max_steps,
            "reward": self.last_reward,
            "eval_reward": self.last_eval_reward,
            "policy_step": self.clock.policy_step,
            "off_policy_lag": self.last_lag,
            "last_checkpoint_step": self.last_checkpoint_step,
            "batch_ready_step": self.newest_batch_step,
        }

    # --- policy updates, checkpoints, eval -------------------------------------------

    async def policy_loop(self) -> None:
        if self.clock.policy_step == 0:  # the initial model, while the first batch is generated
            await self.maybe_evaluate(0)
        while not self.finished.is_set():
            # One by one, in order, none skipped: each may be due a checkpoint or an eval.
            step, location = await self.reports.get()
            started = time.perf_counter()
            await self.load_policy(step, location)
            self.policy_location = location
            self.clock.advance(step)
            for old in [s for s in self.batches if s <= step]:
                self.batches.pop(old)
                self.packed.pop(old, None)
                self.batch_ready.pop(old, None)
            took = time.perf_counter() - started
            self.log_metrics({"time/update_weights": took, "policy_step": float(step),
                              **Histogram("weights/update_latency_s", [took]).counts()}, step)
            await self.after_policy(step)

    async def load_policy(self, step: int, location: str) -> None:
        """Bring every replica to policy `step`. Over NCCL the trainer has already paused,
        loaded and resumed them (`NcclPublisher.publish`), and pausing here could resume a
        replica in the middle of its next broadcast: this only waits to see `step` served."""
        timeout = self.config.weights.timeout_s
        if not location.startswith("nccl://"):
            await self.pool.load_policy(step, location, timeout)
            return
        from rlkube.inference.client import update_weights

        await asyncio.gather(*(update_weights(url, step, location, timeout) for url in self.pool.base_urls))

    async def load_resumed_policy(self, step: int) -> None:
        """The policy of the checkpoint resumed from, before any rollout.

        The trainer may have run past that checkpoint and no longer hold the policy (its gRPC
        server keeps the newest snapshots, storage prunes old ones): it follows this restart
        back to the same checkpoint and publishes `step` again, so a refused load is retried
        until `weights.timeout_s`. Over NCCL there is nothing to load from: the resuming trainer
        republishes `step` into the replicas. Wait until every replica serves exactly `step` (a
        replica that outlived the trainer may serve a later, abandoned policy), or until the
        trainer reports a later one, which the policy loop waits for."""
        timeout = self.config.weights.timeout_s
        deadline = time.monotonic() + timeout
        if not self.policy_location.startswith("nccl://"):
            while True:
                try:
                    await self.pool.load_policy(step, self.policy_location, timeout)
                    return
                except InferenceError as e:
                    if time.monotonic() + RESUMED_POLICY_RETRY_S > deadline:
                        raise RuntimeError(
                            f"resuming at policy {step}: it could not be loaded from {self.policy_location} "
                            f"within weights.timeout_s ({timeout:g}s): {e}"
                        ) from None
                    logger.info("policy %d of the checkpoint is not available yet (the trainer republishes it "
                                "when it restarts from the same checkpoint): %s", step, e)
                    await asyncio.sleep(RESUMED_POLICY_RETRY_S)
        from rlkube.inference.client import NCCL_VERSION_POLL_S, weight_version

        while self.reports.empty():
            versions = await asyncio.gather(*(weight_version(url) for url in self.pool.base_urls))
            if all(version == str(step) for version in versions):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"resuming at policy {step}: the trainer did not republish it over NCCL within "
                    f"weights.timeout_s ({timeout:g}s); the replicas serve versions {versions}"
                )
            await asyncio.sleep(NCCL_VERSION_POLL_S)

    async def after_policy(self, step: int) -> None:
        last = step == self.config.max_steps
        ckpt = self.config.ckpt
        if ckpt is not None and (last or (ckpt.interval and step % ckpt.interval == 0)):
            path = await asyncio.to_thread(checkpoint.save, self.checkpoints_dir, step, self.state_dict())
            self.last_checkpoint_step = step
            logger.info("orchestrator checkpoint %s", path)
        await self.maybe_evaluate(step)
        if last:
            self.phase = "finished"
            self.finished.set()

    async def maybe_evaluate(self, step: int) -> None:
        """Eval at step 0, every `eval.interval` steps and at the last step. Called from the
        policy loop on purpose: no weight update can interleave, so every eval rollout of step
        N sees exactly policy N (training rollouts keep being generated meanwhile)."""
        eval_cfg = self.config.eval
        if self.evaluate is None or eval_cfg is None:
            return
        if step % eval_cfg.interval and step != self.config.max_steps:
            return
        started = time.perf_counter()
        metrics = await self.evaluate(step)
        self.last_eval_reward = metrics.get(EVAL_REWARD, self.last_eval_reward)
        self.log_metrics(metrics | {"time/eval": time.perf_counter() - started}, step)

    def state_dict(self) -> dict:
        return {
            "policy_step": self.clock.policy_step,
            "policy_location": self.policy_location,
            "batches": {
                str(s): {"rollouts": [r.to_dict() for r in b.rollouts], "metrics": b.metrics}
                for s, b in self.batches.items()
                if s > self.clock.policy_step
            },
            "buffer": self.buffer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "samplers": {name: r.sampler.state_dict() for name, r in self.runners.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.clock.advance(state["policy_step"])
        self.newest_batch_step = self.trained_step = state["policy_step"]
        self.policy_location = state["policy_location"]
        for step, saved in state["batches"].items():
            self.store_batch(Batch(int(step), [Rollout.from_dict(r) for r in saved["rollouts"]], saved["metrics"]))
        self.buffer.load_state_dict(state["buffer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for name, sampler_state in state["samplers"].items():
            if name in self.runners:
                self.runners[name].sampler.load_state_dict(sampler_state)

    # --- the whole run ----------------------------------------------------------------

    async def run(self, resume_step: int | None = None) -> None:
        """Until the trainer reports policy `max_steps` (and its checkpoint is written)."""
        if resume_step is not None:
            self.load_state_dict(checkpoint.load(self.checkpoints_dir, resume_step))
            unmark_after(self.checkpoints_dir, resume_step, "orchestrator")  # abandoned steps
            self.last_checkpoint_step = resume_step
            if self.policy_location is not None:
                await self.load_resumed_policy(resume_step)
            if resume_step >= self.config.max_steps:
                logger.info("checkpoint %d is already at max_steps (%d): nothing to do", resume_step, self.config.max_steps)
                self.phase = "finished"
                return
        # Replicas that started paused (or restarted) join the policy before any rollout, and
        # the pool keeps watching for restarts (rlkube.orchestrator.inference).
        timeout = self.config.weights.timeout_s
        await self.pool.sync(self.current_policy(), timeout, fresh=resume_step is None)
        self.phase = "running"
        tasks = [
            asyncio.ensure_future(self.scheduler.run()),
            asyncio.ensure_future(self.policy_loop()),
            asyncio.ensure_future(self.pool.watch(self.current_policy, timeout)),
        ]
        finished = asyncio.ensure_future(self.finished.wait())
        try:
            while not self.finished.is_set():
                done, _ = await asyncio.wait([*tasks, finished], return_when=asyncio.FIRST_COMPLETED)
                for task in done - {finished}:
                    task.result()  # re-raise a crash; a scheduler that cut its last batch just ends
                    tasks.remove(task)
        except BaseException:
            self.phase = "failed"
            raise
        finally:
            for task in [*tasks, finished]:
                task.cancel()
            await asyncio.gather(*tasks, finished, return_exceptions=True)
