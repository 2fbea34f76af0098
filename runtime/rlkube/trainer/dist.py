"""torch.distributed setup that works the same as one plain process and under torchrun.

Always initializes a process group (world size 1 for a plain process), so FSDP2, DCP and
the collectives in the training loop take one code path. Backend from the device: gloo on
CPU, nccl on CUDA.

Across nodes, a rank whose peer is gone (its pod deleted, its node lost) would block in the next
collective until the process group's timeout, 30 minutes for gloo by default, and torchrun's agent
watches only its own workers. So every rank of a world larger than one runs a `PeerWatchdog`: it
heartbeats into torchrun's store and exits the process with `EXIT_PEER_LOST` when a peer's
heartbeat stops for `peer_timeout_s` or the store stops answering. Its torchrun agent then exits
non-zero, which is what the operator's gang restart waits for.
"""

import logging
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from rlkube.ports import free_port

log = logging.getLogger(__name__)

EXIT_PEER_LOST = 75
"""A rank's exit when a peer is gone (EX_TEMPFAIL): a restart of the gang fixes it, unlike 2."""


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



def init_distributed(device: str = "auto", cpu_threads: int | None = None, peer_timeout_s: float = 10.0) -> DistInfo:
    """Join the torchrun job (or make a world of one), pick this rank's device and, on CPU,
    its number of intra-op threads. In a world of several ranks, start the `PeerWatchdog`."""
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
        if world > 1:
            global _watchdog
            _watchdog = PeerWatchdog(rank, world, peer_timeout_s)
            _watchdog.start()
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=resolved)


class PeerWatchdog:
    """Heartbeats this rank into torchrun's store and exits the process when a peer stops.

    Each beat is one `add` to this rank's counter and one per peer to read theirs (a counter, not
    a timestamp, so the pods' clocks need not agree); a peer is gone when its counter has not moved
    for `timeout_s` by this rank's own clock. The beats run in a thread of their own: a store that
    stops answering (it lives in node 0's torchrun agent) blocks a client call past its timeout,
    so a second thread exits the process too when no beat has completed for `timeout_s`. The beats
    hold their own connection to the store; the main thread may be blocked in a collective, which
    releases the GIL. A rank that closes its process group `leave`s: its counter jumps to `LEFT`,
    and its peers, which may still be saving or publishing, stop watching it.

    `leave` stops and joins both threads before it returns. A daemon thread still beating when the
    interpreter exits aborts the process: a store call returning into a finalizing interpreter
    ends its thread (`pthread_exit`) through pybind11's GIL guard, a noexcept destructor, and the
    C++ runtime calls `std::terminate` ("terminate called without an active exception", SIGABRT
    after a run that did everything right).
    """

    LEFT = 1 << 62

    def __init__(self, rank: int, world_size: int, timeout_s: float):
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.interval_s = max(timeout_s / 5, 0.1)
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # torchrun's own restarts reuse the store
        self.prefix = f"rlkube/heartbeat/{attempt}/"
        self.last_beat = time.monotonic()
        self._left = threading.Event()
        self._threads = (threading.Thread(target=self._watch, name="peer-watchdog", daemon=True),
                         threading.Thread(target=self._beat, name="peer-heartbeat", daemon=True))

    def _store(self) -> dist.TCPStore:
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=timedelta(seconds=self.timeout_s))

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def leave(self) -> None:
        """Stop watching (a store call in flight returns within `timeout_s`), and tell the peers
        this rank is done rather than gone."""
        self._left.set()
        for thread in self._threads:
            thread.join()
        try:
            self._store().add(f"{self.prefix}{self.rank}", self.LEFT)
        except (RuntimeError, OSError):  # the store is gone already: the peers will time out on it
            pass

    def _watch(self) -> None:
        while not self._left.wait(self.interval_s):
            if (silent := time.monotonic() - self.last_beat) > self.timeout_s:
                self._exit(f"torchrun's store has not answered for {silent:.1f} s")

    def _beat(self) -> None:
        try:
            store = self._store()
            seen = {peer: (-1, time.monotonic()) for peer in range(self.world_size) if peer != self.rank}
            while not self._left.is_set():
                store.add(f"{self.prefix}{self.rank}", 1)
                now = time.monotonic()
                for peer, (count, since) in list(seen.items()):
                    current = store.add(f"{self.prefix}{peer}", 0)
                    if current >= self.LEFT:
                        del seen[peer]
                    elif current != count:
                        seen[peer] = (current, now)
                    elif now - since > self.timeout_s:
                        self._exit(f"rank {peer} has not heartbeat for {now - since:.1f} s")
                self.last_beat = time.monotonic()
                self._left.wait(self.interval_s)
        except (RuntimeError, OSError) as e:  # DistStoreError, DistNetworkError: node 0's agent is gone
            self._exit(f"torchrun's store stopped answering ({type(e).__name__}: {e})")

    def _exit(self, reason: str) -> None:
        if self._left.is_set():
            return
        log.error("peer lost: %s (peer_timeout_s %s); exiting %d so the gang restarts",
                  reason, self.timeout_s, EXIT_PEER_LOST)
        logging.shutdown()
        os._exit(EXIT_PEER_LOST)


_watchdog: PeerWatchdog | None = None
"""This process's watchdog, which `close_distributed` stops."""


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def close_distributed() -> None:
    global _watchdog
    if _watchdog is not None:
        _watchdog.leave()
        _watchdog = None
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
