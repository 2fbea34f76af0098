"""Peak host memory per rank of building the trainer's sharded model, on 1 and 2 gloo ranks:
`rlkube.trainer.model.build_model` (meta device, shard, each rank reads its own slices of the
checkpoint) against the way rlkube built it before (`from_pretrained` in float32 on every rank,
then `fully_shard`), side by side in one run.

    python benchmarks/model_build.py [--layers 8 --hidden 1024]

The checkpoint is a randomly initialised Qwen3-shaped model (the defaults: ~75M parameters)
saved in bfloat16, as released models are. Memory is the peak growth of the rank's anonymous
resident set (RssAnon, sampled every 5 ms) over the build: a checkpoint mapped from the page
cache is not counted, the float32 parameters and any whole-model copy are. Each build runs in
fresh processes (`torch.distributed.run`). Sharded over 2 ranks, each should hold about half.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def anon_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) / 1024


def rank_main(model_dir: str, how: str, out: str) -> None:
    """One rank: build the model `how` (`meta` or `pretrained`) and report the peak."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint  # imported before the baseline is taken, as transformers is
    from rlkube.config import ModelConfig, ParallelConfig
    from rlkube.trainer.dist import init_distributed
    from rlkube.trainer.model import build_model, parallelize
    from transformers import AutoModelForCausalLM

    info = init_distributed("cpu", cpu_threads=1)
    peak, before = [0.0], anon_mb()

    def sample():
        while True:
            peak[0] = max(peak[0], anon_mb())
            time.sleep(0.005)

    threading.Thread(target=sample, daemon=True).start()
    start = time.perf_counter()
    if how == "meta":
        build_model(ModelConfig(name=model_dir), ParallelConfig(), info.device, torch.float32)
    else:
        parallelize(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), ParallelConfig(), torch.float32)
    took = time.perf_counter() - start
    time.sleep(0.05)
    dist.barrier()
    with open(f"{out}.{info.rank}", "w") as f:
        json.dump({"peak_mb": peak[0] - before, "s": took}, f)
    dist.destroy_process_group()


def measure(model_dir: Path, how: str, ranks: int, tmp: Path) -> dict:
    out = tmp / f"{how}-{ranks}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env |= {"PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
         __file__, "--rank-of", str(model_dir), how, str(out)],
        env=env, check=True, timeout=1200, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    reports = [json.loads(Path(f"{out}.{rank}").read_text()) for rank in range(ranks)]
    return {"peak_mb": max(r["peak_mb"] for r in reports), "s": max(r["s"] for r in reports)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--rank-of", nargs=3, metavar=("MODEL", "HOW", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_of:
        rank_main(*args.rank_of)
        return

    import torch
    from rich.console import Console
    from rich.table import Table
    from rlkube.models.tiny import init_tiny_model
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="rlkube-bench-build-") as tmp:
        tmp = Path(tmp)
        fp32 = init_tiny_model(tmp / "fp32", layers=args.layers, hidden=args.hidden, heads=args.hidden // 64,
                               kv_heads=args.hidden // 128)
        model = AutoModelForCausalLM.from_pretrained(fp32, dtype=torch.bfloat16)
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(tmp / "bf16")
        del model
        rows = {(how, ranks): measure(tmp / "bf16", how, ranks, tmp)
                for how in ("pretrained", "meta") for ranks in (1, 2)}

    table = Table(title=f"peak host memory per rank building a {params / 1e6:.0f}M-parameter model "
                        f"(float32 parameters {params * 4 / 2**20:.0f} MB)")
    for column in ("build", "ranks", "peak MB per rank", "of 1 rank", "seconds"):
        table.add_column(column, justify="left" if column == "build" else "right")
    names = {"pretrained": "from_pretrained, then shard (before)", "meta": "build_model: meta, shard, read own slices"}
    for (how, ranks), row in rows.items():
        ratio = row["peak_mb"] / rows[(how, 1)]["peak_mb"]
        table.add_row(names[how], str(ranks), f"{row['peak_mb']:.0f}", f"{ratio:.2f}", f"{row['s']:.1f}")
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
