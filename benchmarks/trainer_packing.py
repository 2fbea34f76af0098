"""Trainer forward + backward time of one RL step by packing: row length (`orchestrator.seq_len`)
and shared prompts (`orchestrator.share_prompts`).

    python benchmarks/trainer_packing.py [--seq-lens 512 128] [--groups 16] [--repeats 4]

Packs one step of reverse-text-shaped samples (default: 16 groups of 8 samples; a group's
prompt is 19 + L tokens and each completion about L + 6, for strings of L = 5-20 letters, about
what examples/reverse_text/rl.toml trains on) with rlkube's `pack_batch`, in micro-batches of
about 2,048 tokens each, and times the trainer's work on them (forward, per-token log-probs,
backward) on the example's tiny Qwen3 (4 layers, hidden 256) with one thread. Prints the best
of `--repeats` per setting, side by side in one run, and its ratio to the first.

Why it matters: attention over a packed row runs as one dense kernel under a mask, so its cost
grows with tokens x seq_len, and rows much longer than the samples spend that time on
masked-out pairs; and a group's samples all start with the same prompt, which without sharing
the trainer computes once per sample.
"""

import argparse
import random
import tempfile
import time


def make_samples(groups: int, group_size: int, seed: int = 0):
    from rlkube.rollout_types import Sample

    rng = random.Random(seed)
    samples = []
    for _ in range(groups):
        letters = rng.randint(5, 20)
        prompt = [rng.randrange(256) for _ in range(19 + letters)]
        for _ in range(group_size):
            completion = [rng.randrange(256) for _ in range(max(1, letters + rng.randint(0, 12)))]
            samples.append(Sample(
                token_ids=prompt + completion,
                loss_mask=[False] * len(prompt) + [True] * len(completion),
                logprobs=[0.0] * len(prompt) + [-0.5] * len(completion),
                temperature=0.7,
                advantage=rng.gauss(0, 1),
            ))
    return samples


def step_seconds(model, micro_batches) -> float:
    from rlkube.trainer.rl.packed import policy_logprobs

    start = time.perf_counter()
    for batch in micro_batches:
        logprobs, _ = policy_logprobs(model, batch)
        (-(logprobs * batch["advantages"])[batch["loss_mask"]].sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 128])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--tokens-per-micro-batch", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table
    from rlkube.models.tiny import init_tiny_model
    from rlkube.orchestrator.packing import pack_batch
    from rlkube.trainer.rl.attention import register
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-packing-") as tmp:
        model = AutoModelForCausalLM.from_pretrained(init_tiny_model(tmp), dtype=torch.float32,
                                                     attn_implementation=register())  # the trainer's attention
    model.train()
    samples = make_samples(args.groups, args.group_size)
    settings = [(seq_len, share) for seq_len in args.seq_lens for share in (False, True)]
    packed = {
        (seq_len, share): pack_batch(
            samples, seq_len, world_size=1, micro_batch_rows=max(1, args.tokens_per_micro_batch // seq_len),
            share_prompts=share,
        )[0]
        for seq_len, share in settings
    }
    best = dict.fromkeys(settings, float("inf"))
    for _ in range(args.repeats):  # interleaved, so a noisy moment hits every setting alike
        for setting, micro_batches in packed.items():
            best[setting] = min(best[setting], step_seconds(model, micro_batches))

    first = best[settings[0]]
    table = Table(
        title="trainer forward + backward by packing",
        caption=f"{len(samples)} samples in groups of {args.group_size}, best of {args.repeats}",
    )
    for column in ("seq_len", "shared prompts", "tokens", "rows", "micro-batches", "seconds", "vs first"):
        table.add_column(column, justify="right")
    for (seq_len, share), micro_batches in packed.items():
        tokens = sum(int((b["sample_ids"] >= 0).sum()) for b in micro_batches)
        rows = sum(int(b["input_ids"].shape[0]) for b in micro_batches)
        table.add_row(str(seq_len), "yes" if share else "no", str(tokens), str(rows), str(len(micro_batches)),
                      f"{best[seq_len, share]:.2f}", f"{best[seq_len, share] / first:.2f}x")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
