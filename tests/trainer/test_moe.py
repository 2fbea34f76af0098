"""The trainer on a mixture-of-experts model (tiny Qwen3-MoE): FSDP2 over two gloo ranks shards
each decoder layer, experts included, and a DCP checkpoint resumes training bit for bit; LoRA
adapts its attention and leaves the experts frozen; exports keep the per-expert layout."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlkube.config import LoraConfig, ModelConfig, ParallelConfig
from rlkube.trainer.dist import init_distributed
from rlkube.trainer.lora import apply_lora
from rlkube.trainer.model import build_meta_model, build_model, load_tokenizer
from rlkube.trainer.weights import export_hf_weights
from safetensors.torch import load_file
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


def test_lora_adapts_the_attention_of_an_moe_model_and_its_export_is_per_expert(tiny_moe_model, tmp_path, world_of_one):
    """The default targets on an MoE model: attention adapted in every layer, experts and
    router frozen; the merged export is in the checkpoint's per-expert layout."""
    init_distributed("cpu", cpu_threads=1)
    model = build_model(ModelConfig(name=str(tiny_moe_model)), ParallelConfig(), torch.device("cpu"), torch.float32,
                        lora=LoraConfig(rank=4))
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    assert len(trained) == 4 * 4 * 2 and all(".self_attn." in name for name in trained), "4 layers x q,k,v,o x (A, B)"
    out = export_hf_weights(model, load_tokenizer(ModelConfig(name=str(tiny_moe_model))), tmp_path / "export",
                            is_main=True, lora=LoraConfig(rank=4))
    exported, original = load_file(out / "model.safetensors"), load_file(tiny_moe_model / "model.safetensors")
    assert exported.keys() == original.keys()
    assert all(torch.equal(exported[k], t) for k, t in original.items()), "B = 0: the merge is the base"
    with pytest.raises(ValueError, match=r"\['gate_proj'\] adapt no layer of Qwen3MoeForCausalLM: its experts stay frozen"):
        apply_lora(build_meta_model(ModelConfig(name=str(tiny_moe_model))), LoraConfig(target_modules=["gate_proj"]))
