"""Tokens/s and MFU of the real RL trainer step, with its time split, on Qwen3-0.6B and -1.7B shapes.

    python benchmarks/trainer_throughput.py [--models Qwen3-0.6B Qwen3-1.7B] [--steps 5] [--before] [--restart]
    python benchmarks/trainer_throughput.py --tiny --before --restart   # seconds on a CPU: what CI runs

Each model is randomly initialised from its Qwen3 config (no download), written once in bf16,
and trained by the real `RLTrainer.train_step` (FSDP2 over one rank, fp32 master weights, bf16
compute on CUDA, activation checkpointing, AdamW, the storage publisher with the default
overlap) on a stub batch source that serves the same step every time: 4 micro-batches of one
16,384-token row each, packed by the orchestrator's `pack_batch` in two shapes:

- `grpo`: groups of 8 samples sharing a 512-token prompt (kept once per row), completions of
  768-1,280 tokens: what an RL step trains on;
- `prime-rl`: one full-length sample per row, the shape of prime-rl's published tables (its
  single-H100 Qwen3-0.6B RL figure at 16k: 11.9k tokens/s, MFU 11.1 %), so the comparison is
  like for like.

`--before` adds the GRPO rows with the publish as it was before it overlapped the next step
(`weights.overlap = false`, float32 on the wire): before and after side by side, in one process.

The first step of a model (compilation of FlexAttention and its block masks on CUDA; see
`rlkube.trainer.compile_cache`, whose cache lives under `--output-dir`) is reported apart; the
other steps give the medians of the step and its split (`time/*`: waiting for the batch,
forward+backward, optimizer, the publish the step waits for) and the trainer's own
`perf/tokens_per_s`, `perf/mfu` (attention counted by the query-key pairs the packed rows'
mask computes) and `perf/mfu_primerl` (prime-rl's whole-row count, as in its tables;
rlkube.trainer.perf has both formulas).
`--restart` then starts the first model once more in a new process on the same output
directory, as a restarted trainer does, and compares its first step with the cold one. Each
model runs in its own process; peak memory is `torch.cuda.max_memory_allocated` and
`max_memory_reserved` (the caching allocator's hold: what prime-rl's tables report); `--json`
writes every figure.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QWEN3 = {"vocab_size": 151936, "tie_word_embeddings": True, "head_dim": 128, "num_attention_heads": 16,
         "num_key_value_heads": 8, "num_hidden_layers": 28, "max_position_embeddings": 40960}
MODELS = {
    "Qwen3-0.6B": QWEN3 | {"hidden_size": 1024, "intermediate_size": 3072},
    "Qwen3-1.7B": QWEN3 | {"hidden_size": 2048, "intermediate_size": 6144},
    "tiny": {"vocab_size": 4096, "tie_word_embeddings": True, "head_dim": 32, "num_attention_heads": 4,
             "num_key_value_heads": 2, "num_hidden_layers": 2, "hidden_size": 128, "intermediate_size": 256},
}
FULL = {"seq_len": 16384, "rows": 4, "prompt": 512, "completion": (768, 1280), "group_size": 8}
TINY = {"seq_len": 256, "rows": 2, "prompt": 16, "completion": (24, 40), "group_size": 4}
SHAPES = ("grpo", "prime-rl")
BEFORE = {"overlap": False, "dtype": "float32"}
"""`weights` as the publish was before it overlapped the next step: synchronous, float32."""


def variants(before: bool, restart: bool) -> list[tuple[str, str, dict]]:
    """(label, shape, `weights` overrides) of the rows one model process runs, in order."""
    if restart:
        return [("grpo, restarted", "grpo", {})]
    rows = [(shape, shape, {}) for shape in SHAPES]
    return rows + ([("grpo, publish before", "grpo", BEFORE)] if before else [])


def step_batches(shape: str, size: dict, vocab: int, seed: int = 0) -> list[dict]:
    """One step's micro-batches (one row each) of `shape`, packed as the orchestrator packs."""
    from rlkube.orchestrator.packing import pack_batch
    from rlkube.rollout_types import Sample

    rng = random.Random(seed)

    def sample(prompt: list[int], completion_len: int) -> Sample:
        completion = [rng.randrange(vocab) for _ in range(completion_len)]
        return Sample(token_ids=prompt + completion, loss_mask=[False] * len(prompt) + [True] * completion_len,
                      logprobs=[0.0] * len(prompt) + [-1.0] * completion_len, temperature=1.0,
                      advantage=rng.gauss(0, 1))

    seq_len, rows = size["seq_len"], size["rows"]
    samples = []
    if shape == "prime-rl":
        for _ in range(rows):
            samples.append(sample([rng.randrange(vocab) for _ in range(size["prompt"])], seq_len - size["prompt"]))
    else:
        while sum(len(s.token_ids) for s in samples) < 2 * rows * seq_len:  # more than fills `rows` rows
            prompt = [rng.randrange(vocab) for _ in range(size["prompt"])]
            samples += [sample(prompt, rng.randint(*size["completion"])) for _ in range(size["group_size"])]
    micro_batches = pack_batch(samples, seq_len, world_size=1, micro_batch_rows=1, share_prompts=True)[0][:rows]
    loss_tokens = sum(int(b["loss_mask"].sum()) for b in micro_batches)
    return [b | {"global_loss_tokens": loss_tokens} for b in micro_batches]


class StubSource:
    """The trainer's rollout client: the same step's micro-batches every time."""

    def __init__(self, micro_batches: list[dict]):
        self.micro_batches = micro_batches

    def get_batch(self, step, rank, world_size, micro_batch_rows=1):
        return self.micro_batches

    def report_policy(self, step, location, timeout_s=60.0):
        return step


class Records:
    """The trainer's metrics sink: every step's record."""

    def __init__(self):
        self.records: dict[int, dict] = {}

    def log(self, step, metrics):
        self.records[step] = dict(metrics)


def write_model(name: str, path: Path, device: str) -> Path:
    """A randomly initialised Qwen3 of `MODELS[name]`'s shape, saved in bf16."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**MODELS[name])).to(torch.bfloat16)
    model.save_pretrained(path)
    return path


def run_model(name: str, device: str, steps: int, size: dict, output_dir: Path, rows: list) -> dict:
    """`rows` (see `variants`) on one model in this process: each row's first step's time and
    the medians of the `steps` after it."""
    import torch
    from rlkube.config import TrainerConfig
    from rlkube.trainer.rl.setup import build_training_env
    from rlkube.trainer.rl.trainer import RLTrainer
    from rlkube.transport.publishers import make_publisher

    with tempfile.TemporaryDirectory(prefix="rlkube-bench-throughput-") as tmp:
        model_dir = write_model(name, Path(tmp) / "model", device)
        base = TrainerConfig(
            output_dir=output_dir, model={"name": str(model_dir)}, device=device, max_steps=10**6,
            parallel={"activation_checkpointing": True}, weights={"type": "storage", "url": f"{tmp}/weights"},
        )
        env = build_training_env(base)
        results, step = {}, 0
        try:
            for label, shape, weights in rows:
                config = base.model_copy(update={"weights": base.weights.model_copy(update=weights)})
                batches = step_batches(shape, size, MODELS[name]["vocab_size"])
                publisher = make_publisher(config.weights, output_dir, str(model_dir))
                trainer = RLTrainer(config, env, StubSource(batches), publisher, None, Records())
                try:
                    if device == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    start = time.perf_counter()
                    trainer.train_step(step + 1)
                    first = time.perf_counter() - start
                    print(f"{name} {label}: first step {first:.2f} s", file=sys.stderr, flush=True)
                    for n in range(step + 2, step + 2 + steps):
                        trainer.train_step(n)
                    trainer.close()
                finally:
                    publisher.close()
                timed = [trainer.metrics.records[n] for n in range(step + 2, step + 2 + steps)]
                step += steps + 1
                results[label] = {
                    "first_step_s": first,
                    "tokens": int(sum((b["sample_ids"] >= 0).sum() for b in batches)),
                    "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None,
                    "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if device == "cuda" else None,
                    "compiles_after_first": sum(r["perf/compiles"] for r in timed),
                    **{key: statistics.median(r[key] for r in timed) for key in timed[0]
                       if key.startswith(("time/", "perf/")) and key != "perf/compiles"},
                }
        finally:
            env.close()
        results["params"] = sum(p.numel() for p in env.model.parameters())
        return results


def run_child(name: str, args, output_dir: Path, restart: bool = False) -> dict:
    """`run_model` in a process of its own (its stderr passes through: progress as it goes)."""
    command = [sys.executable, __file__, "--device", args.device, "--steps", str(args.steps),
               "--output-dir", str(output_dir), "--child", name]
    command += [flag for flag, on in (("--tiny", args.tiny), ("--before", args.before), ("--restart", restart)) if on]
    child = subprocess.run(command, check=False, stdout=subprocess.PIPE, text=True,
                           env=os.environ | {"TRANSFORMERS_VERBOSITY": "error"})
    if child.returncode:
        sys.exit(f"{name} failed (exit {child.returncode})")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["Qwen3-0.6B", "Qwen3-1.7B"])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per row, after the first (their median)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--output-dir", type=Path, default=None,
                        help="where the compile cache lives (default: a temporary directory: a cold start)")
    parser.add_argument("--before", action="store_true", help="also the GRPO rows with the publish as before the overlap")
    parser.add_argument("--restart", action="store_true",
                        help="then the first model's first step again in a new process, on the compile cache")
    parser.add_argument("--json", type=Path, help="write every figure here (after each model)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and rows on the CPU, in seconds")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        args.models, args.device = ["tiny"], "cpu"
    size = TINY if args.tiny else FULL
    if args.child:
        rows = variants(args.before, args.restart)
        print(json.dumps(run_model(args.child, args.device, args.steps, size, args.output_dir, rows)))
        return
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            sys.exit("no CUDA device: run with --device cpu (slow at these sizes) or --tiny")

    with tempfile.TemporaryDirectory(prefix="rlkube-bench-out-") as default_out:
        output_dir = args.output_dir or Path(default_out)
        results = {}
        runs = [(name, False) for name in args.models] + ([(args.models[0], True)] if args.restart else [])
        for name, restart in runs:
            result = run_child(name, args, output_dir, restart)
            results.setdefault(name, {"params": result.pop("params")}).update(result)
            if args.json:
                args.json.write_text(json.dumps(results, indent=1))
    print_table(results, args, size)


def print_table(results: dict, args, size: dict) -> None:
    import torch
    from rich.console import Console
    from rich.table import Table

    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    table = Table(
        title=f"RL trainer step: {size['rows']} micro-batches of one {size['seq_len']:,}-token row, "
        f"medians of {args.steps} steps after the first",
        caption=f"{where}, torch {torch.__version__}; activation checkpointing; time/publish is what the step "
        "waits for; 'publish before': synchronous, float32 (weights.overlap = false); MFU: attention counted by "
        "the pairs computed, MFU prime-rl: by the whole row",
    )
    columns = ("model", "rows", "tokens", "first step", "step", "fwd+bwd", "optimizer", "publish", "batch wait",
               "tokens/s", "MFU", "MFU prime-rl", "recompiles", "peak allocated", "peak reserved")
    for column in columns:
        table.add_column(column, justify="right")
    for name, result in results.items():
        for label, r in result.items():
            if label == "params":
                continue
            mfu = ["-" if r.get(key) is None else f"{100 * r[key]:.1f} %" for key in ("perf/mfu", "perf/mfu_primerl")]
            table.add_row(
                f"{name} ({result['params'] / 1e6:.0f}M)", label, f"{r['tokens']:,}", f"{r['first_step_s']:.2f} s",
                f"{r['time/step']:.3f} s", f"{r['time/forward_backward']:.3f} s", f"{r['time/optimizer']:.3f} s",
                f"{r['time/publish_weights']:.3f} s", f"{r['time/wait_for_batch']:.4f} s",
                f"{r['perf/tokens_per_s']:,.0f}", *mfu,
                str(r["compiles_after_first"]),
                *("-" if r[key] is None else f"{r[key]:.1f} GiB" for key in ("peak_gib", "peak_reserved_gib")),
            )
    Console(width=220).print(table)
    for name, result in results.items():
        if "prime-rl" in result:  # compute against compute: prime-rl's step also waits for its weight broadcast
            r = result["prime-rl"]
            print(f"{name} prime-rl: tokens / forward+backward = {r['tokens'] / r['time/forward_backward']:,.0f} tokens/s")
        for label in ("grpo", "grpo, publish before"):
            if label in result:
                r = result[label]
                compute = r["time/forward_backward"] + r["time/optimizer"]
                print(f"{name} {label}: step / (forward+backward+optimizer) = {r['time/step'] / compute:.2f}")
        if "grpo, restarted" in result:
            ratio = result["grpo, restarted"]["first_step_s"] / result["grpo"]["first_step_s"]
            print(f"{name}: restarted first step / cold first step = {ratio:.2f}")


if __name__ == "__main__":
    main()
