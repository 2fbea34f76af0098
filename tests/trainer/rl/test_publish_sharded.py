"""A publish from two FSDP2 ranks (gloo) writes the very bytes a one-rank publish of the same
weights writes: gathered in the wire dtype, the tied head sent once."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlkube.transport.weights_snapshot import iter_safetensors
from transformers import AutoModelForCausalLM

from tests.trainer.rl.publish_rank_worker import publish_once

ROOT = Path(__file__).resolve().parents[3]


def published(out: Path) -> bytes:
    return (out / "weights" / "step_1" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_two_ranks_publish_the_bytes_of_one(tiny_model, tmp_path, world_of_one):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(ROOT / "tests/trainer/rl/publish_rank_worker.py"), str(tiny_model), str(tmp_path / "two")],
        env=env, check=True, timeout=600,
    )
    publish_once(str(tiny_model), str(tmp_path / "one"))
    two, one = published(tmp_path / "two"), published(tmp_path / "one")
    assert two == one, "two ranks published other bytes than one"

    tensors = dict(iter_safetensors({"model.safetensors": two}))
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    weights = {name: p for name, p in model.named_parameters()}  # each tensor once: no tied head
    assert "lm_head.weight" not in tensors and tensors.keys() == weights.keys()
    for name, tensor in tensors.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, weights[name].detach().bfloat16()), name
    print(f"published {sum(t.nbytes for t in tensors.values())} tensor bytes, as one rank does")
