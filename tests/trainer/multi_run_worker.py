"""Run by test_multi_run.py under torchrun: a pool of two runs against their solo trainers;
rank 0 writes what differed in each rank's shards to OUT_JSON (a list, one entry per rank).

    torchrun --nproc-per-node 2 tests/trainer/multi_run_worker.py MODEL_DIR ROOT PORT_A PORT_B OUT_JSON
"""

import json
import os
import sys
from pathlib import Path

import torch

from tests.trainer.test_multi_run import pooled_against_solo


def main(model_dir: str, root: str, port_a: str, port_b: str, out: str) -> None:
    rank = int(os.environ["RANK"])
    results = pooled_against_solo(model_dir, Path(root), {"a": int(port_a), "b": int(port_b)}, rank)
    if rank == 0:
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:])
