"""The reverse-text SFT example as written (shortened), then `rlkube eval` on its export.

Reuses the session's vLLM server (`inference_server`, serving the untrained `tiny_model`):
the SFT export is loaded into it, evaluated, and the original weights are put back.
"""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlkube.checkpoints import complete_steps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NUM_EXAMPLES = 32


def run(args: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True, text=True,
                            timeout=timeout, cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def evaluate(server, out: Path) -> dict:
    run([
        "rlkube.entrypoints.eval", "--base-url", server.base_url, "--model.name", server.model_name,
        "--num-examples", str(NUM_EXAMPLES), "--sampling.max-tokens", "48", "--output-dir", str(out),
    ])
    (result,) = json.loads((out / "eval_results.json").read_text())["results"]
    return result


def load_export(server, weights: Path, step: int) -> None:
    from rlkube.inference.client import update_weights
    from rlkube.transport.weights_snapshot import Snapshot
    from rlkube.transport.weights_storage import write_snapshot
    from safetensors.torch import load_file

    state_dict = load_file(weights / "model.safetensors")
    snapshot = write_snapshot(str(weights.parent / "snapshots"), Snapshot(state_dict, step, weights))
    asyncio.run(update_weights(server.base_url, step, snapshot, timeout=300))


def test_sft_example_then_eval_serves_the_export(tiny_model, inference_server, tmp_path):
    sft_out = tmp_path / "sft"
    run([
        "rlkube.entrypoints.sft", "@", "examples/reverse_text/sft.toml",
        "--model.name", str(tiny_model), "--output-dir", str(sft_out),
        "--max-steps", "30", "--data.batch-size", "32", "--ckpt.interval", "15",
    ])
    assert complete_steps(sft_out / "checkpoints", ("trainer",)) == [30]  # keep_last = 1 pruned step 15
    weights = (sft_out / "weights" / "final").resolve()
    assert weights.name == "step_30"

    before = evaluate(inference_server, tmp_path / "eval_before")
    load_export(inference_server, weights, step=30)
    try:
        after = evaluate(inference_server, tmp_path / "eval_after")
    finally:
        inference_server.restore_weights()
    assert before["num_examples"] == after["num_examples"] == NUM_EXAMPLES
    assert not after["errors"] and 0 < after["avg_at_k"] <= 1
    # the export was really loaded and served: greedy answers (hence rewards) changed.
    # 30 steps are far too few to score well (reverse-text needs ~250 steps to take off;
    # the example's reward levels are measured by running it, see sft.toml).
    assert after["rewards"] != before["rewards"]
