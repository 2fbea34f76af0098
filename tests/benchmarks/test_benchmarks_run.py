"""Every script in benchmarks/ runs, at a tiny size, and prints its figures: none can rot.

A new script needs an entry in `TINY` (its arguments for a run of seconds, and a piece of what
it prints) or in `NOT_RUN` (why not here); the test over the directory fails otherwise.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"

TINY = {
    "compile_cache.py": (["--tiny"], "restart / cold"),
    "delta_weights.py": (["--tiny"], "fewer bytes"),
    "grpc_transport.py": (["--rows", "4", "--seq-len", "512", "--micro-batch-rows", "2", "--repeats", "1"], "GB/s"),
    "lora_weights.py": (["--ranks", "8"], "lora r=8"),
    "model_build.py": (["--layers", "2", "--hidden", "128"], "read own slices"),
    "operator_api.py": (["--runs", "2", "--seconds", "2", "--settle", "0.5", "--burst", "4"], "children existed"),
    "operator_failover.py": (["--tiny"], "failover of lease"),
    "orchestrator.py": (["--steps", "1", "--batch-size", "8", "--group-size", "4", "--max-concurrent", "8",
                         "--rounds", "1"], "CPU per rollout"),
    "publish_overlap.py": (["--tiny"], "RL trainer step"),
    "trainer_memory.py": (["--tiny", "--old-limit-gb", "0"], "new: step memory"),
    "trainer_packing.py": (["--seq-lens", "128", "--groups", "2", "--repeats", "1"], "vs first"),
    "trainer_throughput.py": (["--tiny", "--before", "--restart"], "restarted first step / cold"),
    "tail_scheduling.py": (["--tails", "5", "--bounds", "0", "1", "--steps", "3", "--p50-s", "0.01", "--train-s", "0.05",
                            "--over-provision", "1", "2"],
                           "speedup vs sync"),
}
NOT_RUN = {
    "fake_engine.py": "a stand-in vLLM server, not a benchmark: orchestrator.py runs it",
    "async_vs_sync.py": "two whole `rlkube rl` runs with vLLM engines (minutes each): beyond a CI run's budget",
    "agentic_tail.py": "an SFT warm-up and four whole `rlkube rl` runs with vLLM engines per tail: beyond a CI "
                       "run's budget",
    "pool.py": "three solo `rlkube rl` runs per seed and one `rlkube pool` run, each with a vLLM engine: beyond a "
               "CI run's budget; tests/integration/test_pool.py runs `rlkube pool` on the real engine",
    "weights.py": "starts a vLLM engine (~45 s) for its reloads: beyond a CI run's budget",
    "multinode.py": "needs root (network namespaces) and runs two two-rank trainer worlds: 4-6 min on the "
                    "2-core VM under load, beyond a test's 300 s; e2e/scenarios/test_multinode.py runs two trainer pods",
}


SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))


def test_every_script_is_run_or_says_why_not():
    missing = set(SCRIPTS) - set(TINY) - set(NOT_RUN)
    assert not missing, f"give {sorted(missing)} an entry in TINY or NOT_RUN"


@pytest.mark.slow  # each a whole process that trains, serves or runs an operator: 8-300 s (2-core VM)
@pytest.mark.parametrize("script", [name for name in SCRIPTS if name in TINY])
def test_the_benchmark_runs_at_a_tiny_size(script, tmp_path):
    args, figures = TINY[script]
    root = BENCHMARKS.parent
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert figures in done.stdout, f"{script} did not print its figures:\n{done.stdout[-2000:]}"
