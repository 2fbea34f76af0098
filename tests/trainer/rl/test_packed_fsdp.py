"""Packed log-probs under FSDP2 on two gloo ranks: the LM head runs on chunks after the
decoder, inside the model's forward, and recomputes them in backward; sharding must not change
the log-probs or the gradients."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_two_sharded_ranks_give_the_unsharded_logprobs_and_gradients(tiny_model, tmp_path):
    out = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(ROOT / "tests/trainer/rl/fsdp_logprobs_worker.py"), str(tiny_model), str(out)],
        env=env, check=True, timeout=600,
    )
    report = json.loads(out.read_text())
    assert report["logprob_diff"] < 1e-5 and report["grad_max"] > 0
    # both ranks ran the same batch, so FSDP's average over ranks is the one-rank gradient
    assert report["grad_diff"] <= 1e-5 * report["grad_max"] + 1e-7
