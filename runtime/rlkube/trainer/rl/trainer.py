"""The RL trainer: pull this rank's micro-batches, optimize the RL loss, publish the new policy.

One RL step (`n = 1 .. max_steps`) is: fetch batch `n` over gRPC (this rank's share), forward
and backward every micro-batch (gradients accumulate; the loss is already normalized by the
step's global loss-token count), ONE optimizer step, publish policy `n` (rank 0 writes it, the
orchestrator is told where; in the background while step `n+1` computes, `weights.overlap`),
a checkpoint every `ckpt.interval` steps, metrics.

    torchrun --nproc-per-node 2 -m rlkube.entrypoints.trainer @ outputs/run/configs/trainer.toml

(`rlkube rl` writes that file and runs this for you.)
"""

import logging
import math
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from rlkube.config import TrainerConfig
from rlkube.trainer.compile_cache import compiled_graphs
from rlkube.trainer.model import resolve_dtype
from rlkube.trainer.perf import Throughput, peak_flops
from rlkube.trainer.publish import PolicyPublishing, wire_dtype
from rlkube.trainer.rl.attention import visible_pairs
from rlkube.trainer.rl.loss import LossInputs, compute_loss, resolve_loss_fn
from rlkube.trainer.rl.packed import policy_logprobs
from rlkube.trainer.rl.router import RouterProbe

if TYPE_CHECKING:
    from rlkube.trainer.rl.setup import TrainingEnv

logger = logging.getLogger(__name__)

MAX_STATS = ("mismatch_kl/max",)
"""Statistics reduced with max across micro-batches and ranks; all others are sums of shares."""


class RLTrainer:
    def __init__(self, config: TrainerConfig, env: "TrainingEnv", client, publisher, checkpointer, metrics):
        self.config = config
        self.env = env
        self.model, self.optimizer, self.scheduler = env.model, env.optimizer, env.scheduler
        self.client = client
        self.publisher = publisher
        self.checkpointer = checkpointer
        self.metrics = metrics
        self.loss_fn = resolve_loss_fn(config.loss)
        self.router = RouterProbe.attach(self.model, config.loss.router_replay)  # None: a dense model
        self.publishing = PolicyPublishing(
            publisher, client, wire_dtype(config.weights.dtype, resolve_dtype(config.model.dtype, env.device)),
            is_main=env.rank == 0, overlap=config.weights.overlap, barrier=env.barrier,
        )
        self.throughput = Throughput(self.model, env.world_size, peak_flops(env.device, config.metrics.peak_flops))
        self.step = 0
        self.trained_tokens = 0
        """Tokens trained (all ranks) by this process since it started: a pool's fair share."""
        self.timings: dict[str, float] = {}

    @contextmanager
    def timed(self, name: str):
        """`time/<name>`: the wall time of the block, including the device work it queued."""
        start = time.perf_counter()
        yield
        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
        self.timings[f"time/{name}"] = time.perf_counter() - start

    def train(self) -> None:
        self.resume()
        while self.step < self.config.max_steps:
            self.train_step(self.step + 1)
        self.publishing.wait()  # the final policy is published and reported
        logger.info("finished at step %d", self.step)

    def close(self) -> None:
        """Finish the publish in flight (raising its error) and take the router probe off the
        model (which a pool's other runs go on training)."""
        try:
            self.publishing.close()
        finally:
            if self.router:
                self.router.detach()

    def resume(self) -> None:
        """Restore step `resume_step` and republish its weights (not reported: the
        orchestrator restores its own policy step and loads the same location, waiting for
        them), so they are there even if a later step's publish had pruned them, or served by
        this process for gRPC transfer."""
        if self.checkpointer is None or self.config.ckpt is None:
            return
        step = self.checkpointer.resolve(self.config.ckpt.resume_step)  # None: start fresh
        if step is not None:
            self.publishing.expect(step)  # a replica asking for it meanwhile waits for it
            self.step = self.checkpointer.load(step, self.model, self.optimizer, self.scheduler)
        self.checkpointer.abandon_after(self.step)  # later steps belong to an abandoned continuation
        if step is not None:
            logger.info("resumed from step %d", self.step)
            self.publish_policy(self.step, resumed=True)

    def train_step(self, step: int) -> None:
        self.timings = {}
        start, compiled = time.perf_counter(), compiled_graphs()
        with self.timed("wait_for_batch"):
            micro_batches = self.client.get_batch(step, self.env.rank, self.env.world_size, self.config.micro_batch_size)
        if not micro_batches[0]["global_loss_tokens"]:  # the same on every rank: all stop together
            raise RuntimeError(f"batch {step} has no tokens to train on: the orchestrator must not serve it")
        with self.timed("forward_backward"):
            stats, tokens, pairs = self.forward_backward(micro_batches)
        lr = self.scheduler.get_last_lr()[0]
        with self.timed("optimizer"):
            grad_norm = self.optimizer_step()
        self.step = step
        self.trained_tokens += tokens
        with self.timed("publish_weights"):
            self.publish_policy(step)
        with self.timed("save_ckpt"):
            self.maybe_save_checkpoint(step)
        self.timings["time/step"] = time.perf_counter() - start
        perf = self.throughput.metrics(tokens, pairs, self.timings["time/step"], micro_batches[0]["input_ids"].shape[-1])
        perf["perf/compiles"] = compiled_graphs() - compiled
        if self.env.compile_cache is not None:
            self.env.compile_cache.save_if_compiled()
        self.log_metrics(step, stats | {"optim/grad_norm": grad_norm, "optim/lr": lr} | perf)

    def forward_backward(self, micro_batches: list[dict]) -> tuple[dict[str, float], int, int]:
        """Accumulate gradients over this rank's micro-batches; returns the step's statistics
        (reduced over ranks, with `samples/trained`: the samples with loss tokens that all ranks
        trained on), its tokens and its attention's query-key pairs (`visible_pairs`) across ranks."""
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=self.env.device))
        tokens = pairs = samples = 0
        for micro_batch in micro_batches:
            batch = {k: v.to(self.env.device) if torch.is_tensor(v) else v for k, v in micro_batch.items()}
            with self.router.micro_batch(batch) if self.router else nullcontext():
                loss, stats = self.micro_batch_loss(batch)
                # FSDP averages gradients over ranks; the loss is already a share of the GLOBAL
                # mean, so scale by the world size to make the reduction a sum.
                (loss * self.env.world_size).backward()
            for name, value in stats.items():
                sums[name] = torch.maximum(sums[name], value) if name in MAX_STATS else sums[name] + value
            # counted on the host copy: no device sync between micro-batches
            tokens += int((micro_batch["sample_ids"] >= 0).sum())
            pairs += visible_pairs(micro_batch["sample_ids"], micro_batch["prefix_ids"])
            samples += int(micro_batch["sample_ids"][micro_batch["loss_mask"]].unique().numel())
        stats = self.reduce_stats(dict(sums))
        tokens, pairs, samples = self.reduce_counts(tokens, pairs, samples)
        stats["samples/trained"] = float(samples)
        return (self.router.summarize(stats) if self.router else stats), tokens, pairs

    def micro_batch_loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Recompute log-probs with each token's sampling temperature, then the loss (and, for
        an MoE model, the routing statistics: rlkube.trainer.rl.router)."""
        logprobs, entropy = policy_logprobs(self.model, batch)
        inputs = LossInputs(
            logprobs=logprobs,
            inference_logprobs=batch["inference_logprobs"],
            advantages=batch["advantages"],
            loss_mask=batch["loss_mask"],
            sample_ids=batch["sample_ids"],
            teacher_logprobs=batch.get("teacher_logprobs"),
        )
        loss, stats = compute_loss(inputs, self.config.loss, batch["global_loss_tokens"], self.loss_fn, entropy)
        if self.router:
            stats |= self.router.stats(batch["global_loss_tokens"])
        return loss, stats

    def reduce_stats(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        if self.env.world_size > 1:
            for name, value in stats.items():
                dist.all_reduce(value, op=dist.ReduceOp.MAX if name in MAX_STATS else dist.ReduceOp.SUM)
        return {name: float(value) for name, value in stats.items()}

    def reduce_counts(self, *counts: int) -> list[int]:
        if self.env.world_size == 1:
            return list(counts)
        totals = torch.tensor(counts, device=self.env.device)
        dist.all_reduce(totals)
        return totals.tolist()

    def optimizer_step(self) -> float:
        """Clip and step; a non-finite gradient norm (the loss went NaN or inf: the same on
        every rank) raises `FloatingPointError` before the step, so no NaN policy is published
        (in a pool this fails that run alone: rlkube.trainer.pool)."""
        grad_norm = self.env.clip_grad_norm(self.config.optim.max_grad_norm)
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(f"step {self.step + 1}: gradient norm {grad_norm}: the loss is not finite")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(grad_norm)

    def publish_policy(self, step: int, resumed: bool = False) -> None:
        """Every rank helps snapshot the weights (a LoRA run's adapters only); rank 0 publishes
        them and tells the orchestrator where they are, in the background while the next step
        computes (`weights.overlap`; rlkube.trainer.publish). A resumed step is only
        republished, before training goes on."""
        if resumed:
            self.publishing.republish(step, self.env.policy_tensors())
            return
        self.publishing.publish(step, self.env.policy_tensors())
        if self.publishing.overlap and self.publishing.last_publish_s is not None:
            self.timings["time/publish_background"] = self.publishing.last_publish_s  # the previous policy's
        if self.publishing.last_publish_bytes is not None:  # the previous policy's when overlapped
            self.timings["weights/bytes"] = float(self.publishing.last_publish_bytes)

    def maybe_save_checkpoint(self, step: int) -> None:
        ckpt = self.config.ckpt
        if ckpt is None:
            return
        if step == self.config.max_steps or (ckpt.interval is not None and step % ckpt.interval == 0):
            self.checkpointer.save(step, self.model, self.optimizer, self.scheduler)

    def log_metrics(self, step: int, stats: dict[str, float]) -> None:
        """`perf/tokens_per_s` (trained tokens of all ranks per second of the whole step),
        `perf/mfu` and `perf/mfu_primerl` (rlkube.trainer.perf), `perf/compiles` (graphs Dynamo
        compiled during the step: the first step's warm-up, 0 after unless shapes change), the
        `time/*` split and `weights/bytes` (what the newest finished publish sent)."""
        if self.env.rank == 0:
            self.metrics.log(step, {**stats, **self.timings})


def run(config: TrainerConfig) -> None:
    """Build everything from the config, train to `max_steps`, clean up."""
    from rlkube.config.cli import write_finished_step
    from rlkube.trainer.rl.run_io import open_run_io
    from rlkube.trainer.rl.setup import build_training_env

    env = build_training_env(config)
    io = open_run_io(config, env.rank)
    trainer = None
    try:
        trainer = RLTrainer(config, env, io.client, io.publisher, io.checkpointer, io.metrics)
        trainer.train()
        if env.rank == 0:
            wait_until_loaded(io.client, config.max_steps, config.weights.timeout_s)
            write_finished_step(trainer.step)
    finally:
        try:
            if trainer is not None:
                trainer.close()  # the background publish uses the client and the publisher
        finally:
            io.close()
            env.close()


def wait_until_loaded(client, step: int, timeout_s: float) -> None:
    """Stay up until inference has loaded the final policy: with gRPC weight transfer this
    process serves the weights, and the run is only finished once they are in use."""
    from rlkube.transport.client import RolloutError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.status().policy_step >= step:
                return
        except RolloutError:
            logger.warning("orchestrator gone before confirming policy %d was loaded", step)
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"inference did not load policy {step} within {timeout_s:g}s (weights.timeout_s)")
        time.sleep(0.5)
