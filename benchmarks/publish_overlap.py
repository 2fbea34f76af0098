"""The RL trainer's step with the weight publish on the critical path (`weights.overlap =
false`) and off it (`true`, the default), side by side in one run.

    python benchmarks/publish_overlap.py [--layers 8 --hidden 1024 --seq-len 32] [--steps 3 --rounds 2]
                                         [--transport storage grpc] [--dtype auto|float32|bfloat16]
    python benchmarks/publish_overlap.py --tiny     # seconds: what CI runs so the script cannot rot

The real `RLTrainer.train_step` on a randomly initialised Qwen3-shaped model (the defaults:
~75M parameters, 0.3 GB in float32; no download): real forward and backward of the RL loss on
one packed row of `--seq-len` tokens, the real AdamW step and the real publisher writing (or
serving) every policy. Only the batch source is a stub (an in-process client that returns the
same batch every step and records the policies reported). Both modes train the same model in
the same process, in alternating blocks of `--steps` steps (`--rounds` blocks each), every
block after an untimed warm-up step (its first publish allocates the host buffers); a block's
time includes waiting for its last publish. The row is short by default so that, on a small
CPU machine, the publish is a sizeable part (>= 30 %) of the synchronous step.

Per mode it prints the median step time, its forward+backward and optimizer parts, the
publish time the step waits for (the whole publish when synchronous; the snapshot into the
host buffers, plus any wait for the previous publish, when overlapped), the background publish
(write/serve + report) when overlapped, and the publish's share of the synchronous step; then
the ratio of the two step times. The figures depend on the machine (cores, memory bandwidth,
disk): measure on the one you care about.
"""

import argparse
import statistics
import tempfile
from pathlib import Path


def packed_batch(seq_len: int, vocab: int):
    """One row of two samples of `seq_len / 2` tokens, the second half of each a completion;
    sample 0 rewarded, sample 1 punished."""
    import torch

    half = seq_len // 2
    g = torch.Generator().manual_seed(0)
    sample_ids = torch.tensor([[0] * half + [1] * half], dtype=torch.int32)
    positions = torch.arange(half).repeat(2).unsqueeze(0)
    loss_mask = positions >= half // 2
    return {
        "input_ids": torch.randint(0, vocab, (1, 2 * half), generator=g), "position_ids": positions,
        "sample_ids": sample_ids, "prefix_ids": torch.full_like(sample_ids, -1), "loss_mask": loss_mask,
        "advantages": (torch.where(sample_ids == 0, 1.0, -1.0) * loss_mask).float(),
        "temperatures": torch.ones(1, 2 * half), "inference_logprobs": torch.full((1, 2 * half), -5.0),
        "global_loss_tokens": int(loss_mask.sum()),
    }


class StubSource:
    """The trainer's client: the same batch every step; the reported policies are recorded."""

    def __init__(self, batch):
        self.batch, self.reports = batch, []

    def get_batch(self, step, rank, world_size, micro_batch_rows=1):
        return [self.batch]

    def report_policy(self, step, location, timeout_s=60.0):
        self.reports.append(step)
        return step


def bench_block(config, env, model_dir: Path, out_dir: Path, batch, first_step: int, steps: int) -> dict:
    """One untimed warm-up step (the first publish allocates the host buffers), then `steps`
    timed ones."""
    from rlkube.trainer.rl.trainer import RLTrainer
    from rlkube.transport.publishers import make_publisher

    publisher = make_publisher(config.weights, out_dir, str(model_dir))
    source = StubSource(batch)
    trainer = RLTrainer(config, env, source, publisher, None, NoMetrics())
    rows = []
    try:
        trainer.train_step(first_step)
        for step in range(first_step + 1, first_step + 1 + steps):
            trainer.train_step(step)
            rows.append({**trainer.timings, "background": trainer.publishing.last_publish_s or 0.0})
        trainer.close()
    finally:
        publisher.close()
    assert source.reports == list(range(first_step, first_step + 1 + steps)), source.reports
    return {"rows": rows}


def summary(blocks: list[dict], overlap: bool) -> dict:
    """Medians over the blocks' steps (robust to a busy machine's spikes); a step's time
    includes any wait for the previous publish."""
    rows = [row for block in blocks for row in block["rows"]]

    def median(key):
        return statistics.median(row[key] for row in rows)

    return {
        "step_s": median("time/step"),
        "forward_backward_s": median("time/forward_backward"), "optimizer_s": median("time/optimizer"),
        "publish_waited_s": median("time/publish_weights"),
        "publish_background_s": median("background") if overlap else 0.0,
    }


class NoMetrics:
    def log(self, step, metrics):
        pass


def run(args) -> tuple[list[dict], float]:
    """One row per transport and mode: the modes of a transport alternate, block by block, so
    that a drift in the machine's load hits both."""
    from rlkube.config import TrainerConfig
    from rlkube.models.tiny import init_tiny_model
    from rlkube.ports import free_port
    from rlkube.trainer.rl.setup import build_training_env

    with tempfile.TemporaryDirectory(prefix="rlkube-bench-publish-") as tmp:
        tmp = Path(tmp)
        model_dir = init_tiny_model(tmp / "model", layers=args.layers, hidden=args.hidden, heads=args.hidden // 64,
                                    kv_heads=max(args.hidden // 128, 1))
        base = TrainerConfig(
            output_dir=tmp / "out", model={"name": str(model_dir)}, device="cpu", max_steps=10**6,
            cpu_threads=args.threads, weights={"dtype": args.dtype, "grpc_port": args.port or free_port()},
        )
        env = build_training_env(base)
        gigabytes = sum(p.numel() for p in env.model.parameters()) * 4 / 1e9
        batch = packed_batch(args.seq_len, env.model.config.vocab_size)
        results, step = [], 1
        try:
            for transport in args.transport:
                blocks: dict[bool, list[dict]] = {False: [], True: []}
                for _ in range(args.rounds):
                    for overlap in (False, True):
                        weights = base.weights.model_copy(update={"type": transport, "overlap": overlap})
                        config = base.model_copy(update={"weights": weights})
                        out_dir = tmp / f"out-{transport}-{overlap}"
                        blocks[overlap].append(bench_block(config, env, model_dir, out_dir, batch, step, args.steps))
                        step += args.steps + 1
                results += [{"transport": transport, "overlap": overlap, **summary(blocks[overlap], overlap)}
                            for overlap in (False, True)]
        finally:
            env.close()
        return results, gigabytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per block (after one warm-up step)")
    parser.add_argument("--rounds", type=int, default=3, help="blocks per mode, the modes alternating")
    parser.add_argument("--transport", nargs="+", choices=["storage", "grpc"], default=["storage", "grpc"])
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="weights.dtype")
    parser.add_argument("--threads", type=int, default=None, help="trainer.cpu_threads (default: torch's)")
    parser.add_argument("--port", type=int, default=None, help="grpc: the weight server's port (default: a free one)")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, hidden-256 model, 1 step per mode and transport (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.layers, args.hidden, args.seq_len, args.steps, args.rounds = 2, 256, 32, 1, 1
    results, gigabytes = run(args)

    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"RL trainer step on CPU, {gigabytes:.2f} GB of float32 weights (weights.dtype = {args.dtype}), "
                        f"{args.seq_len}-token row, medians of {args.rounds} x {args.steps} steps per mode")
    for column in ("weights.type", "weights.overlap", "step s", "forward+backward s", "optimizer s",
                   "publish waited for s", "publish in background s", "publish share of the step"):
        table.add_column(column, justify="right")
    for row in results:
        share = row["publish_waited_s"] / row["step_s"]
        table.add_row(row["transport"], str(row["overlap"]).lower(), *(f"{row[k]:.3f}" for k in list(row)[2:]),
                      f"{share:.0%}")
    console = Console(width=180)
    console.print(table)
    for sync, overlapped in zip(results[::2], results[1::2], strict=True):
        console.print(
            f"{sync['transport']}: overlapped step / synchronous step = {overlapped['step_s'] / sync['step_s']:.2f} "
            f"({sync['step_s'] / overlapped['step_s']:.2f}x the steps per second)"
        )


if __name__ == "__main__":
    main()
