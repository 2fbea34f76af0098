"""torch.distributed setup that works the same as one plain process and under torchrun.

Always initializes a process group (world size 1 for a plain process), so FSDP2, DCP and
the collectives in the training loop take one code path. Backend from the device: gloo on
CPU, nccl on CUDA.
"""

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rlkube.ports import free_port


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_device(choice: str, local_rank: int = 0) -> torch.device:
    """`auto` picks CUDA when available; `cuda` without a GPU is an error."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device: 'cuda' requested but no CUDA device is available")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")



def init_distributed(device: str = "auto", cpu_threads: int | None = None) -> DistInfo:
    """Join the torchrun job (or make a world of one), pick this rank's device and, on CPU,
    its number of intra-op threads."""
    if "RANK" not in os.environ:  # a plain process: a world of one
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    resolved = resolve_device(device, local_rank)
    if resolved.type == "cuda":
        torch.cuda.set_device(resolved)
    elif cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    if not dist.is_initialized():
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world, device_id=resolved if backend == "nccl" else None)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=resolved)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def close_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(value: float, device: torch.device) -> float:
    """Sum a Python number over all ranks."""
    tensor = torch.tensor(float(value), dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.item()


def all_reduce_max(value: int, device: torch.device) -> int:
    """Max of a Python int over all ranks."""
    tensor = torch.tensor(int(value), dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())
