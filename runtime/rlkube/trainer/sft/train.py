"""The SFT training loop: small named steps over the shared trainer infrastructure.

    rlkube sft @ examples/reverse_text/sft.toml                      # one process
    torchrun --nproc-per-node 2 -m rlkube.entrypoints.sft @ sft.toml  # FSDP2 over 2 ranks

Each optimizer step takes `data.batch_size` samples across all ranks, packs each rank's share
into `seq_len` rows and runs them in micro-batches of `micro_batch_size` rows (gradient
accumulation). The loss is the token-level cross entropy summed over all loss tokens of
the step on all ranks, divided by their count, so it does not depend on how samples fall
into rows, micro-batches or ranks.
"""

import math
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rlkube.config import SFTConfig, write_toml
from rlkube.config.cli import write_finished_step
from rlkube.logs import get_logger, setup_logging
from rlkube.metrics import MetricsSink
from rlkube.trainer.ckpt import CheckpointManager
from rlkube.trainer.dist import all_reduce_max, all_reduce_sum, close_distributed, init_distributed
from rlkube.trainer.model import build_model, count_parameters, load_tokenizer, resolve_dtype
from rlkube.trainer.optim import build_optimizer, build_scheduler, clip_grad_norm
from rlkube.trainer.packing import collate, empty_row_batch
from rlkube.trainer.sft.data import ChatTokenizer, FakeBatches, SFTBatches, load_rows
from rlkube.trainer.sft.status import StatusServer
from rlkube.trainer.weights import export_adapter, export_hf_weights

logger = get_logger(__name__)


def point_final_at(export: Path) -> None:
    """`weights/final` -> the last export: a stable path for what comes next (RL, eval).
    Swapped atomically (a new link renamed over the old one)."""
    link = export.parent / "final"
    tmp = export.parent / ".final.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(export.name)
    tmp.replace(link)


def token_loss_sum(logits: torch.Tensor, target_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Summed cross entropy over the masked tokens."""
    ce = F.cross_entropy(logits.flatten(0, 1).float(), target_ids.flatten(), reduction="none")
    return (ce * loss_mask.flatten()).sum()


class SFTTrainer:
    def __init__(self, config: SFTConfig) -> None:
        self.config = config
        self.dist = init_distributed(config.device, config.cpu_threads, config.peer_timeout_s)
        self._prepare_output_dir()
        setup_logging(config.log.level, config.output_dir / "logs" / f"sft_rank{self.dist.rank}.log")
        torch.manual_seed(config.seed)
        self.tokenizer = load_tokenizer(config.model)
        self.dtype = resolve_dtype(config.model.dtype, self.dist.device)
        self.model = build_model(config.model, config.parallel, self.dist.device, self.dtype, lora=config.lora, lora_field="lora")
        self.num_params = count_parameters(self.model)
        self.optimizer = build_optimizer(self.model, config.optim)
        self.scheduler = build_scheduler(self.optimizer, config.scheduler, config.max_steps)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.batches = self._build_batches()
        self.ckpt = None
        if config.ckpt is not None and not config.bench:
            self.ckpt = CheckpointManager(config.output_dir, config.ckpt, is_main=self.dist.is_main)
        self.metrics = MetricsSink(
            config.output_dir, "sft", wandb=config.wandb, enabled=self.dist.is_main,
            run_config=config.model_dump(mode="json"),
        )
        self.step = 0
        self.tokens_per_s: list[float] = []
        self.status = None
        if self.dist.is_main and config.status_port is not None:
            self.status = StatusServer(config.status_host, config.status_port, step=0, max_steps=config.max_steps)

    def _prepare_output_dir(self) -> None:
        config = self.config
        resuming = config.ckpt is not None and config.ckpt.resume_step is not None
        if config.clean_output_dir and resuming:
            raise ValueError("clean_output_dir: refused when resuming (ckpt.resume_step is set)")
        if self.dist.is_main:
            if config.clean_output_dir and config.output_dir.exists():
                shutil.rmtree(config.output_dir)
            write_toml(config, config.output_dir / "configs" / "sft.toml")
        torch.distributed.barrier()

    def _build_batches(self):
        c = self.config
        if c.bench:
            return FakeBatches(
                batch_size=c.data.batch_size, seq_len=c.data.seq_len, vocab_size=len(self.tokenizer),
                rank=self.dist.rank, world_size=self.dist.world_size, seed=c.seed,
            )
        tokenize = ChatTokenizer(self.tokenizer, c.model.name, c.data.loss_roles, c.data.layout)
        return SFTBatches(
            load_rows(c.data), tokenize, batch_size=c.data.batch_size, seq_len=c.data.seq_len,
            rank=self.dist.rank, world_size=self.dist.world_size, seed=c.seed, shuffle=c.data.shuffle,
        )

    def resume(self) -> None:
        """Restore model, optimizer, scheduler, step and data position when asked to."""
        step = self.ckpt.resolve_resume_step() if self.ckpt is not None else None
        if step is None:
            return
        state = self.ckpt.load(step, self.model, self.optimizer, self.scheduler)
        self.step = int(state["step"])
        self._report(step=self.step, last_checkpoint_step=self.step)
        self.batches.load_state_dict(state["data"])

    def micro_batches(self) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of the next step, padded with loss-free ones so every
        rank runs the same number (FSDP's collectives need all ranks in step)."""
        rows = self.batches.next_rows()
        size, seq_len = self.config.micro_batch_size, self.config.data.seq_len
        chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
        count = all_reduce_max(len(chunks), self.dist.device)
        batches = [collate(chunk, seq_len, self.pad_id) for chunk in chunks]
        batches += [empty_row_batch(size, seq_len, self.pad_id) for _ in range(count - len(chunks))]
        return [{k: v.to(self.dist.device) for k, v in b.items()} for b in batches]

    def forward_backward(self, batch: dict[str, torch.Tensor], loss_tokens: float, last: bool) -> float:
        """One micro-batch; returns its summed loss. Gradients are averaged over ranks by
        FSDP, hence the `world_size` factor to get a sum over all loss tokens."""
        self.model.set_requires_gradient_sync(last)
        logits = self.model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
        loss_sum = token_loss_sum(logits, batch["target_ids"], batch["loss_mask"])
        (loss_sum * self.dist.world_size / max(loss_tokens, 1.0)).backward()
        return loss_sum.item()

    def optimizer_step(self) -> float:
        grad_norm = clip_grad_norm(self.model, self.config.optim.max_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def train_step(self) -> dict[str, float]:
        start = time.perf_counter()
        lr = self.scheduler.get_last_lr()[0]
        batches = self.micro_batches()
        local_tokens = sum(b["loss_mask"].sum().item() for b in batches)
        loss_tokens = all_reduce_sum(local_tokens, self.dist.device)
        loss_sum = 0.0
        for i, batch in enumerate(batches):
            loss_sum += self.forward_backward(batch, loss_tokens, last=i == len(batches) - 1)
        grad_norm = self.optimizer_step()
        loss = all_reduce_sum(loss_sum, self.dist.device) / max(loss_tokens, 1.0)
        seconds = time.perf_counter() - start
        tokens = all_reduce_sum(sum(b["input_ids"].numel() for b in batches), self.dist.device)
        self.step += 1
        return {
            "loss": loss, "lr": lr, "grad_norm": grad_norm, "loss_tokens": int(loss_tokens),
            "tokens_per_s": tokens / seconds, "step_s": seconds,
        }

    def after_step(self, metrics: dict[str, float], progress) -> None:
        c = self.config
        if not math.isfinite(metrics["loss"]):
            raise FloatingPointError(f"step {self.step}: loss is {metrics['loss']}")
        self.tokens_per_s.append(metrics["tokens_per_s"])
        self._report(step=self.step, loss=metrics["loss"])
        if self.step % c.metrics_interval == 0 or self.step == c.max_steps:
            self.metrics.log(self.step, metrics)
        if self.ckpt is not None and self.ckpt.should_save(self.step, c.max_steps):
            train_state = {"step": self.step, "data": self.batches.state_dict()}
            self.ckpt.save(self.step, self.model, self.optimizer, self.scheduler, train_state)
            self._report(last_checkpoint_step=self.step)
        if not c.bench and (self.step == c.max_steps or (c.weights_interval and self.step % c.weights_interval == 0)):
            out = c.output_dir / "weights" / f"step_{self.step}"
            final = self.export_weights(out)
            if self.dist.is_main and self.step == c.max_steps:
                point_final_at(final)
            logger.info(f"exported weights to {out}")
        if progress is not None:
            progress.update(progress.task_ids[0], completed=self.step)

    def export_weights(self, out: Path) -> Path:
        """Collective: the step's weights to `out`: a LoRA run's adapters (and its merged
        model to `<out>_merged` with `lora.export_merged`), else the full model. Returns the
        export `weights/final` should name: a full model when there is one."""
        lora, is_main = self.config.lora, self.dist.is_main
        if lora is None:
            return export_hf_weights(self.model, self.tokenizer, out, is_main=is_main)
        export_adapter(self.model, lora, self.config.model.name, out, is_main=is_main)
        if not lora.export_merged:
            return out
        return export_hf_weights(self.model, self.tokenizer, out.with_name(f"{out.name}_merged"), is_main=is_main, lora=lora)

    def run(self) -> None:
        self.resume()
        c = self.config
        logger.info(
            f"SFT {c.model.name} ({self.num_params / 1e6:.2f}M params) on {self.dist.world_size} x "
            f"{self.dist.device.type}, steps {self.step} -> {c.max_steps}"
        )
        progress = self._progress_bar()
        try:
            while self.step < c.max_steps:
                self.after_step(self.train_step(), progress)
        except BaseException:
            self._report(phase="failed")
            raise
        finally:
            if progress is not None:
                progress.stop()
        self._report(phase="finished")
        if self.dist.is_main:
            write_finished_step(self.step)
        if c.bench and self.dist.is_main:
            rates = self.tokens_per_s[1:] or self.tokens_per_s
            print(f"bench: {sum(rates) / len(rates):,.0f} tokens/s over {len(rates)} steps "
                  f"({self.dist.world_size} x {self.dist.device.type}, seq_len {c.data.seq_len})")

    def _progress_bar(self):
        if not self.dist.is_main:
            return None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        progress = Progress(
            TextColumn("sft"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
            console=self.metrics.console_out, transient=True,
        )
        progress.add_task("sft", total=self.config.max_steps, completed=self.step)
        progress.start()
        return progress

    def _report(self, **fields) -> None:
        if self.status is not None:
            self.status.update(**fields)

    def close(self) -> None:
        if self.status is not None:
            self.status.close()
        self.metrics.close()
        close_distributed()
