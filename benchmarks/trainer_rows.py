"""Trainer forward + backward time of one RL step by packed row length (`orchestrator.seq_len`).

    python benchmarks/trainer_rows.py [--seq-lens 512 256 128] [--samples 128] [--repeats 4]

Packs one step of reverse-text-sized samples (default: 128 samples of 40-62 tokens, about what
examples/reverse_text/rl.toml trains on) with rlkube's `pack_batch` into rows of each
`seq_len`, in micro-batches of about 2,048 tokens each, and times the trainer's work on them
(forward, per-token log-probs, backward) on the example's tiny Qwen3 (4 layers, hidden 256)
with one thread. Prints the best of `--repeats` per row length, side by side in one run, and
its ratio to the first.

Why it matters: a sample attends only to itself, but attention over a packed row runs as one
dense kernel under a block-diagonal mask, so its cost grows with rows x seq_len^2 = tokens x
seq_len; rows much longer than the samples spend that time on masked-out pairs.
"""

import argparse
import random
import tempfile
import time


def make_samples(count: int, min_len: int, max_len: int, seed: int = 0):
    from rlkube.orchestrator.types import Sample

    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        n = rng.randint(min_len, max_len)
        prompt = n * 3 // 5  # about the reverse-text prompt/completion split
        samples.append(Sample(
            token_ids=[rng.randrange(256) for _ in range(n)],
            loss_mask=[i >= prompt for i in range(n)],
            logprobs=[-0.5 if i >= prompt else 0.0 for i in range(n)],
            temperature=0.7,
            advantage=rng.gauss(0, 1),
        ))
    return samples


def step_seconds(model, micro_batches) -> float:
    from rlkube.trainer.rl.loss import token_logprobs

    start = time.perf_counter()
    for batch in micro_batches:
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        logprobs, _ = token_logprobs(logits, batch["input_ids"], batch["temperatures"])
        (-(logprobs * batch["advantages"])[batch["loss_mask"]].sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 256, 128])
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--min-len", type=int, default=40)
    parser.add_argument("--max-len", type=int, default=62)
    parser.add_argument("--tokens-per-micro-batch", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table
    from transformers import AutoModelForCausalLM

    from rlkube.models.tiny import init_tiny_model
    from rlkube.orchestrator.packing import pack_batch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-rows-") as tmp:
        model = AutoModelForCausalLM.from_pretrained(init_tiny_model(tmp), dtype=torch.float32)
    model.train()
    samples = make_samples(args.samples, args.min_len, args.max_len)
    packed = {
        seq_len: pack_batch(samples, seq_len, world_size=1, micro_batch_rows=max(1, args.tokens_per_micro_batch // seq_len))[0]
        for seq_len in args.seq_lens
    }
    best = dict.fromkeys(args.seq_lens, float("inf"))
    for _ in range(args.repeats):  # interleaved, so a noisy moment hits every setting alike
        for seq_len, micro_batches in packed.items():
            best[seq_len] = min(best[seq_len], step_seconds(model, micro_batches))

    table = Table(
        title="trainer forward + backward by row length",
        caption=f"{args.samples} samples of {args.min_len}-{args.max_len} tokens, best of {args.repeats}",
    )
    for column in ("seq_len", "rows", "micro-batches", "seconds", f"vs seq_len {args.seq_lens[0]}"):
        table.add_column(column, justify="right")
    for seq_len, micro_batches in packed.items():
        rows = sum(int(b["input_ids"].shape[0]) for b in micro_batches)
        table.add_row(str(seq_len), str(rows), str(len(micro_batches)), f"{best[seq_len]:.2f}",
                      f"{best[seq_len] / best[args.seq_lens[0]]:.2f}x")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
