"""Process setup shared by the SFT and RL trainers."""

import os
import subprocess
import sys

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
