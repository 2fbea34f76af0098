"""Peak memory and time per token of one RL trainer step by packed row length: the trainer's
attention over segments and chunked log-probs ("new") against the dense `seq_len x seq_len`
mask and full-vocabulary logits rlkube used before ("old", copied below as the baseline).

    python benchmarks/trainer_memory.py [--seq-lens 2048 8192 32768] [--threads 2] [--device cuda]
    python benchmarks/trainer_memory.py --tiny      # a 2-layer model at 256 and 512 tokens: what CI runs

One step is the forward and backward of the default RL loss on one packed row of `seq_len`
tokens (GRPO-shaped groups of 8 samples sharing their prompt) for a randomly initialised
~55M-parameter Qwen3-shaped model built from a `Qwen3Config` (no download), on CPU in float32.
Decoder layers recompute their activations in backward (`parallel.activation_checkpointing`),
else the layers' own activations (~1 MB per token here, linear) pass 24 GB near 32k tokens.
Each configuration runs in a fresh process, and its memory is the growth of the process's peak
resident set (`ru_maxrss`) over the step, measured after the model, its gradient buffers and
the batch exist: the step's activations and temporaries. Prints a table and the 32k/2k ratio
of that growth (linear in the row length gives 16; an `S x S` tensor, 256).

`--device cuda`: the same on the GPU, where the trainer's attention is FlexAttention (compiled:
one untimed step first, at the same length), and memory is the growth of the peak of
`torch.cuda.max_memory_allocated` over the step.
"""

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

MODEL = {
    "vocab_size": 32768, "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 12,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "tie_word_embeddings": True,
}
TINY_MODEL = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 32}
OLD_PATH_LIMIT_GB = 16.0


# --- the baseline: rlkube's packed log-probs before linear-memory attention (commit 8beec0b) ---

def legacy_attention_mask(sample_ids, prefix_ids):
    import torch

    seq_len = sample_ids.shape[-1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=sample_ids.device).tril()
    query_segment, key_segment = sample_ids.unsqueeze(-1), sample_ids.unsqueeze(-2)
    query_prefix = prefix_ids.unsqueeze(-1)
    visible = (key_segment == query_segment) | ((key_segment == query_prefix) & (query_prefix >= 0))
    return (visible & causal).unsqueeze(1)


def legacy_predictor_positions(mask):
    import torch

    seq_len = mask.shape[-1]
    earlier = mask[:, 0] & torch.ones(seq_len, seq_len, dtype=torch.bool, device=mask.device).tril(-1)
    positions = torch.arange(seq_len, device=mask.device)
    return torch.where(earlier, positions, -1).amax(-1)


def legacy_token_logprobs(logits, input_ids, temperatures, predictors):
    import torch

    rows, seq_len = input_ids.shape
    predicted = predictors >= 0
    source = predictors.clamp(min=0)
    spill = torch.where(predicted, predictors, seq_len)
    position_temps = temperatures.new_ones(rows, seq_len + 1).scatter(1, spill, temperatures)[:, :seq_len]
    log_probs = torch.log_softmax(logits.float() / position_temps.clamp(min=1e-6).unsqueeze(-1), dim=-1)
    picked = log_probs[torch.arange(rows, device=logits.device).unsqueeze(-1), source, input_ids]
    with torch.no_grad():
        entropy = -(log_probs.exp() * log_probs).sum(-1).gather(1, source)
    return torch.where(predicted, picked, 0.0), torch.where(predicted, entropy, 0.0)


def legacy_policy_logprobs(model, batch):
    mask = legacy_attention_mask(batch["sample_ids"], batch["prefix_ids"])
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask).logits
    return legacy_token_logprobs(logits, batch["input_ids"], batch["temperatures"], legacy_predictor_positions(mask))


# --- one configuration, in a child process ---

def old_path_estimate_gb(seq_len: int) -> float:
    """The old path's largest tensors: S x S int64 predictors, ~5 S x S bool/float masks,
    ~4 full-vocabulary fp32 copies of the logits."""
    return (seq_len**2 * (8 + 5) + 4 * seq_len * MODEL["vocab_size"] * 4) / 1e9


def packed_row(seq_len: int, seed: int = 0) -> dict:
    """The fullest row of a step of GRPO-shaped groups: prompts of 128-512 tokens, 8
    completions of 64-768 tokens each, prompts shared."""
    from rlkube.orchestrator.packing import pack_batch
    from rlkube.rollout_types import Sample

    rng = random.Random(seed)
    samples = []
    while sum(len(s.token_ids) for s in samples) < 3 * seq_len:
        prompt = [rng.randrange(MODEL["vocab_size"]) for _ in range(rng.randint(128, 512))]
        for _ in range(8):
            completion = [rng.randrange(MODEL["vocab_size"]) for _ in range(rng.randint(64, 768))]
            samples.append(Sample(
                token_ids=prompt + completion, loss_mask=[False] * len(prompt) + [True] * len(completion),
                logprobs=[0.0] * len(prompt) + [-1.0] * len(completion), temperature=1.0,
                advantage=rng.gauss(0, 1),
            ))
    micro_batches = pack_batch(samples, seq_len, world_size=1, micro_batch_rows=1, share_prompts=True)[0]
    return micro_batches[0]


def run_one(path: str, seq_len: int, threads: int, device: str) -> dict:
    import torch
    from rlkube.config import LossConfig
    from rlkube.trainer.rl.attention import register
    from rlkube.trainer.rl.loss import LossInputs, compute_loss
    from rlkube.trainer.rl.packed import policy_logprobs
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    attention = register() if path == "new" else "sdpa"
    model = Qwen3ForCausalLM(Qwen3Config(**MODEL, attn_implementation=attention)).to(device)
    model.config.use_cache = False
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in packed_row(seq_len).items()}
    batch["inference_logprobs"] = torch.where(batch["loss_mask"], -1.0, 0.0)
    logprobs_fn = policy_logprobs if path == "new" else legacy_policy_logprobs

    def step() -> None:
        logprobs, entropy = logprobs_fn(model, batch)
        inputs = LossInputs(logprobs, batch["inference_logprobs"], batch["advantages"], batch["loss_mask"], batch["sample_ids"])
        loss, _ = compute_loss(inputs, LossConfig(), int(batch["loss_mask"].sum()), entropy=entropy)
        loss.backward()

    on_gpu = device == "cuda"
    if on_gpu:
        step()  # compiles FlexAttention's kernels
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 1e9
    else:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    start = time.perf_counter()
    step()
    if on_gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 1e9 if on_gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "tokens": int((batch["sample_ids"] >= 0).sum()),
        "baseline_gb": before, "step_gb": peak - before, "seconds": seconds,
    }


# --- the parent: every configuration side by side ---

def torch_device_name() -> str:
    import torch

    return f"{torch.cuda.get_device_name()}, torch {torch.__version__}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--old-limit-gb", type=float, default=OLD_PATH_LIMIT_GB,
                        help="skip the old path where its estimated largest tensors exceed this")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model at 256 and 512 tokens, in seconds")
    parser.add_argument("--child", nargs=2, metavar=("PATH", "SEQ_LEN"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        MODEL.update(TINY_MODEL)
        if "--seq-lens" not in sys.argv:
            args.seq_lens = [256, 512]
    if args.child:
        print(json.dumps(run_one(args.child[0], int(args.child[1]), args.threads, args.device)))
        return

    from rich.console import Console
    from rich.table import Table

    results: dict[tuple[str, int], dict | str] = {}
    # the new path first: its figures are the point, and the old path's are the slow ones
    for path in ("new", "old"):
        for seq_len in args.seq_lens:
            if path == "old" and (estimate := old_path_estimate_gb(seq_len)) > args.old_limit_gb:
                results[path, seq_len] = f"skipped: needs ~{estimate:.0f} GB (> {args.old_limit_gb:g} GB)"
                continue
            child = subprocess.run(
                [sys.executable, __file__, "--threads", str(args.threads), "--device", args.device,
                 "--child", path, str(seq_len)] + (["--tiny"] if args.tiny else []),
                check=False, capture_output=True, text=True, env=os.environ | {"TRANSFORMERS_VERBOSITY": "error"},
            )
            if child.returncode:
                results[path, seq_len] = f"failed (exit {child.returncode}): {child.stderr.strip()[-200:]}"
            else:
                results[path, seq_len] = json.loads(child.stdout.strip().splitlines()[-1])
            print(path, seq_len, results[path, seq_len], flush=True)

    first = next(r for r in results.values() if isinstance(r, dict))
    table = Table(
        title="one RL trainer step (forward + backward) on one packed row",
        caption=f"Qwen3-shaped, {first['params'] / 1e6:.0f}M parameters, float32, activation checkpointing, "
        + (f"{torch_device_name()}; memory: growth of peak CUDA allocation over the step" if args.device == "cuda"
           else f"CPU, {args.threads} threads; memory: growth of peak RSS over the step")
        + " (fresh process each)",
    )
    for column in ("seq_len", "tokens", "old: step memory", "new: step memory", "old: µs/token", "new: µs/token"):
        table.add_column(column, justify="right")
    for seq_len in args.seq_lens:
        old, new = results["old", seq_len], results["new", seq_len]

        def cell(r, key, fmt):
            return fmt(r[key]) if isinstance(r, dict) else r

        tokens = next((r["tokens"] for r in (old, new) if isinstance(r, dict)), "-")
        table.add_row(
            str(seq_len), str(tokens),
            cell(old, "step_gb", lambda v: f"{v:.2f} GB"), cell(new, "step_gb", lambda v: f"{v:.2f} GB"),
            cell(old, "seconds", lambda v, r=old: f"{v / r['tokens'] * 1e6:.0f}"),
            cell(new, "seconds", lambda v, r=new: f"{v / r['tokens'] * 1e6:.0f}"),
        )
    Console(width=140).print(table)
    low, high = min(args.seq_lens), max(args.seq_lens)
    for path in ("old", "new"):
        a, b = results[path, low], results[path, high]
        if isinstance(a, dict) and isinstance(b, dict):
            print(f"{path}: step memory at {high} / at {low} tokens = {b['step_gb'] / a['step_gb']:.1f}x "
                  f"(tokens x{high / low:g})")


if __name__ == "__main__":
    main()
