"""Process setup shared by the SFT and RL trainers."""

import os
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch.distributed as dist
from rlkube.ports import free_port
from rlkube.trainer.dist import PeerWatchdog

SETUP = """
import torch
from rlkube.trainer.dist import close_distributed, init_distributed
init_distributed("cpu", cpu_threads={threads})
print(torch.get_num_threads())
close_distributed()
"""


def threads_after_setup(threads: int | None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "2"  # torch's default without the setting
    out = subprocess.run([sys.executable, "-c", SETUP.format(threads=threads)], env=env,
                         capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.strip().splitlines()[-1])


def test_cpu_threads_sets_the_intra_op_thread_count():
    assert threads_after_setup(None) == 2
    assert threads_after_setup(1) == 1


def test_a_rank_that_leaves_has_no_watchdog_thread_left(monkeypatch):
    """A watchdog thread still beating when the interpreter exits aborts the process
    (`PeerWatchdog`'s doc): `leave` returns only once both its threads have ended, and the store
    reads the rank as left. The peer timeout (60 s) is long enough that rank 0's silence here
    never ends the test process."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    watchdog = PeerWatchdog(rank=1, world_size=2, timeout_s=60.0)
    watchdog.start()
    deadline = time.monotonic() + 30
    while store.add(f"{watchdog.prefix}1", 0) == 0:  # its first beat
        assert time.monotonic() < deadline, "the watchdog never beat"
        time.sleep(0.05)
    watchdog.leave()
    alive = [t.name for t in threading.enumerate() if t.name in ("peer-watchdog", "peer-heartbeat")]
    assert not alive, f"{alive} still running after leave()"
    assert store.add(f"{watchdog.prefix}1", 0) >= PeerWatchdog.LEFT
