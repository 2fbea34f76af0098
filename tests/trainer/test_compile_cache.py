"""Compiled kernels live with the run (rlkube.trainer.compile_cache): a new process on another
machine (another output directory) reads what the first compiled from the run's store."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlkube.trainer.compile_cache import cache_key

WORKER = Path(__file__).with_name("compile_cache_worker.py")


def run_worker(output_dir: Path, url: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    done = subprocess.run([sys.executable, str(WORKER), str(output_dir), url], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two processes that compile with inductor and gcc
def test_a_new_pod_reads_the_kernels_the_first_one_compiled_from_the_store(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    first = run_worker(tmp_path / "pod-a", store)
    assert first["misses"] >= 1 and first["hits"] == 0, first
    key = cache_key(torch.device("cpu"))
    assert any((tmp_path / "pod-a" / "compile_cache" / key).iterdir()), "the local cache is the run's"
    assert (tmp_path / "store" / f"{key}.bin").stat().st_size > 0

    second = run_worker(tmp_path / "pod-b", store)  # an empty output directory: only the store has them
    assert second["hits"] >= 1 and second["misses"] == 0, second


def test_the_key_names_torch_python_and_device():
    key = cache_key(torch.device("cpu"))
    assert torch.__version__ in key and f"py{sys.version_info.major}.{sys.version_info.minor}" in key
    assert "/" not in key
