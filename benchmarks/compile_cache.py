"""The first step's compilation, cold against a restarted trainer with the run's compile cache.

    python benchmarks/compile_cache.py [--seq-len 2048] [--layers 28] [--device cpu|cuda]
    python benchmarks/compile_cache.py --tiny       # what CI runs so the script cannot rot

Three fresh processes, one after the other, each timing its first step from the point a trainer
reaches it (torch, transformers and rlkube imported, the run's cache activated by
`rlkube.trainer.compile_cache.CompileCache`):

- `cold`: an empty output directory and an empty store: everything compiles;
- `restart`: the same output directory (a pod restarted on its PVC, or a local rerun);
- `new pod`: an empty output directory, the store the first one wrote (`trainer.compile_cache_url`:
  the run's object-store prefix under the operator).

The step is the trainer's compiled work on one packed row of GRPO-shaped groups (8 samples
sharing a prompt): the FlexAttention `BlockMask` of the row, then FlexAttention with Qwen3-0.6B's
heads (16 query, 8 KV, 128 dims) for each of `--layers` layers; forward and backward on CUDA,
forward only on a CPU (FlexAttention has no backward there; the CPU trainer attends with SDPA
tiles and compiles nothing). The second step packs other samples (other lengths, the same row
shape): its `recompiles` (graphs Dynamo compiled in it) should be 0. Prints the first and second
step of each process, where its first step's compilation went (`PHASES`), and restart / cold.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
PHASES = {"dynamo": "_compile.compile_inner", "tracing": "bytecode_tracing",
          "backend": "OutputGraph.call_user_compiler", "guards": "build_guards"}
"""Torch's own timers (`torch._dynamo.utils.compile_times`) of the first step's compilation:
all of Dynamo's work on a frame, of which tracing the bytecode, AOTAutograd and Inductor (on a
cache hit: loading the cached graph and its kernels), and building the guards."""


def phase_seconds() -> dict[str, float]:
    from torch._dynamo.utils import compilation_time_metrics

    return {name: sum(compilation_time_metrics.get(timer, [])) for name, timer in PHASES.items()}


def first_step(output_dir: Path, store: str, device: str, seq_len: int, layers: int) -> dict:
    import torch
    import transformers  # noqa: F401 - a trainer has it imported (with torch._dynamo) before its first step
    from rlkube.trainer.compile_cache import CompileCache, compiled_graphs
    from rlkube.trainer.rl.attention import Segments, _compiled_flex_attention
    from torch._dynamo.utils import counters
    from trainer_memory import packed_row

    cache = CompileCache(output_dir, torch.device(device), store)
    cache.activate()
    grad = device == "cuda"
    dtype = torch.bfloat16 if grad else torch.float32
    query = torch.randn(1, HEADS, seq_len, HEAD_DIM, device=device, dtype=dtype, requires_grad=grad)
    key, value = (torch.randn(1, KV_HEADS, seq_len, HEAD_DIM, device=device, dtype=dtype, requires_grad=grad)
                  for _ in range(2))

    def step(seed: int) -> None:
        row = packed_row(seq_len, seed)  # other samples, other lengths: the same shapes
        segments = Segments(row["sample_ids"].to(device), row["prefix_ids"].to(device))
        with torch.set_grad_enabled(grad):
            out = sum(_compiled_flex_attention()(query, key, value, block_mask=segments.block_mask(),
                                                 enable_gqa=True).float().sum() for _ in range(layers))
            if grad:
                out.backward()
        if device == "cuda":
            torch.cuda.synchronize()

    start = time.perf_counter()
    step(0)
    first, compiled, phases = time.perf_counter() - start, compiled_graphs(), phase_seconds()
    start = time.perf_counter()
    step(1)
    second = time.perf_counter() - start
    cache.save_if_compiled()
    return {"first_s": first, "second_s": second, "recompiles": compiled_graphs() - compiled, "phases": phases,
            "hits": counters["inductor"]["fxgraph_cache_hit"], "misses": counters["inductor"]["fxgraph_cache_miss"]}


def run_child(args, output_dir: Path, store: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).parent), env.get("PYTHONPATH")]))
    child = subprocess.run(
        [sys.executable, __file__, "--device", args.device, "--seq-len", str(args.seq_len), "--layers",
         str(args.layers), "--child", str(output_dir), store],
        check=False, capture_output=True, text=True, env=env,
    )
    if child.returncode:
        sys.exit(f"child failed (exit {child.returncode}):\n{child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tiny", action="store_true", help="a short row, two layers; no new-pod run")
    parser.add_argument("--child", nargs=2, metavar=("OUTPUT_DIR", "STORE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tiny:
        args.seq_len, args.layers = 512, 2
    if args.child:
        print(json.dumps(first_step(Path(args.child[0]), args.child[1], args.device, args.seq_len, args.layers)))
        return

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("no CUDA device: run with --device cpu")
    with tempfile.TemporaryDirectory(prefix="rlkube-bench-compile-") as tmp:
        tmp = Path(tmp)
        store = f"file://{tmp / 'store'}"
        runs = {"cold": run_child(args, tmp / "run", store), "restart": run_child(args, tmp / "run", store)}
        if not args.tiny:
            runs["new pod"] = run_child(args, tmp / "other-pod", store)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    print(f"first step: FlexAttention block mask + {args.layers} layers over one {args.seq_len}-token row "
          f"({'forward and backward' if args.device == 'cuda' else 'forward'}), {where}, torch {torch.__version__}")
    print(f"{'':10} {'first step':>11} {'second step':>12} {'recompiles':>11} {'cache hits':>11} {'misses':>7}")
    for name, r in runs.items():
        print(f"{name:10} {r['first_s']:10.2f}s {r['second_s']:11.3f}s {r['recompiles']:11d} {r['hits']:11d} "
              f"{r['misses']:7d}")
    print("the first step's compilation (torch's timers): Dynamo in all, of which tracing, AOTAutograd+Inductor, guards")
    for name, r in runs.items():
        print(f"{name:10} " + " ".join(f"{phase} {r['phases'][phase]:6.2f}s" for phase in PHASES))
    cold = runs["cold"]["first_s"]
    for name in runs:
        if name != "cold":
            print(f"{name} / cold (first step): {runs[name]['first_s'] / cold:.1%}")


if __name__ == "__main__":
    main()
