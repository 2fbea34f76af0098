"""Rollout batch transport over gRPC on loopback: GB/s from the orchestrator to one trainer rank.

    python benchmarks/grpc_transport.py [--rows 64] [--seq-len 8192] [--micro-batch-rows 4] [--repeats 5]

The orchestrator side serves a pre-packed batch (packing is not timed); the trainer side is the
real `RolloutClient`, decoding every tensor. Bytes counted are the tensors' payload.
"""

import argparse
import asyncio
import threading
import time

import torch
from rlkube.transport.client import RolloutClient
from rlkube.transport.microbatch import TENSOR_FIELDS
from rlkube.transport.server import start_server, stop_server


def make_micro_batches(rows: int, seq_len: int, micro_batch_rows: int) -> list[dict]:
    out = []
    for _ in range(rows // micro_batch_rows):
        shape = (micro_batch_rows, seq_len)
        out.append(
            {
                "input_ids": torch.randint(0, 150_000, shape),
                "position_ids": torch.arange(seq_len).expand(shape).contiguous(),
                "sample_ids": torch.zeros(shape, dtype=torch.int32),
                "prefix_ids": torch.full(shape, -1, dtype=torch.int32),
                "loss_mask": torch.rand(shape) > 0.5,
                "advantages": torch.randn(shape),
                "inference_logprobs": -torch.rand(shape),
                "temperatures": torch.ones(shape),
                "global_loss_tokens": rows * seq_len // 2,
            }
        )
    return out


class Source:
    instance_id = "benchmark-orchestrator"

    def __init__(self, micro_batches):
        self.micro_batches = micro_batches

    async def get_batch(self, step, rank, world_size, micro_batch_rows):
        return self.micro_batches

    async def report_policy(self, step, location):
        return step

    def status(self):
        return {"phase": "running", "step": 0, "max_steps": 0, "reward": None, "policy_step": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=8192)
    parser.add_argument("--micro-batch-rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    micro_batches = make_micro_batches(args.rows, args.seq_len, args.micro_batch_rows)
    payload = sum(mb[name].numel() * mb[name].element_size() for mb in micro_batches for name in TENSOR_FIELDS)

    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(start_server(Source(micro_batches), "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    times = []
    with RolloutClient(f"127.0.0.1:{server.port}", timeout_s=120) as client:
        client.get_batch(0, 0, 1, args.micro_batch_rows)  # warm-up (connection, allocations)
        for _ in range(args.repeats):
            start = time.perf_counter()
            got = client.get_batch(0, 0, 1, args.micro_batch_rows)
            times.append(time.perf_counter() - start)
    assert all(torch.equal(g["input_ids"], m["input_ids"]) for g, m in zip(got, micro_batches))
    asyncio.run_coroutine_threadsafe(stop_server(server, 1), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)

    best, median = min(times), sorted(times)[len(times) // 2]
    print(f"batch: {args.rows} rows x {args.seq_len} tokens in {len(micro_batches)} micro-batches, "
          f"{payload / 1e6:.1f} MB of tensors")
    print(f"gRPC loopback: best {payload / best / 1e9:.2f} GB/s ({best * 1e3:.0f} ms), "
          f"median {payload / median / 1e9:.2f} GB/s ({median * 1e3:.0f} ms) over {args.repeats} fetches")


if __name__ == "__main__":
    main()
