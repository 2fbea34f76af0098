"""The trainer on a mixture-of-experts model (tiny Qwen3-MoE): FSDP2 over two gloo ranks shards
each decoder layer, experts included, and a DCP checkpoint resumes training bit for bit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]


def assert_equal(actual, expected, where: str) -> None:
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), where
        for key in expected:
            assert_equal(actual[key], expected[key], f"{where}.{key}")
    elif torch.is_tensor(expected):
        assert torch.equal(actual, expected), where
    else:
        assert actual == expected, where


@pytest.mark.slow
def test_two_gloo_ranks_shard_the_experts_and_resume_exactly(tiny_moe_model, tmp_path):
    out = tmp_path / "report.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(REPO / "tests/trainer/moe_rank_worker.py"), str(tiny_moe_model), str(tmp_path / "ckpt"), str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, cwd=REPO, env=env, timeout=300)
    report = torch.load(out)

    assert report["sharding"] == [{"local_experts": 2, "layers_are_fsdp_units": True}] * 2, "4 experts, 2 per rank"
    reference = AutoModelForCausalLM.from_pretrained(tiny_moe_model, dtype=torch.float32).state_dict()
    assert_equal(report["initial"], reference, "built")  # the per-expert checkpoint, stacked
    continued, resumed = report["continued"], report["resumed"]
    assert not torch.equal(continued["model"]["model.layers.0.mlp.experts.down_proj"],
                           reference["model.layers.0.mlp.experts.down_proj"]), "the experts trained"
    assert_equal(resumed, continued, "resumed")
