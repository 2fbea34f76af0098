"""The trainer's model: built on the meta device, sharded, each rank reading its own slices of
the checkpoint, it must be the very model `from_pretrained` loads."""

import shutil

import pytest
import torch
from rlkube.config import ModelConfig, ParallelConfig
from rlkube.trainer.dist import init_distributed
from rlkube.trainer.model import build_model
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

CPU = torch.device("cpu")


def build(path) -> torch.nn.Module:
    init_distributed("cpu", cpu_threads=1)
    return build_model(ModelConfig(name=str(path)), ParallelConfig(), CPU, torch.float32)


def test_the_sharded_build_is_the_pretrained_model(tiny_model, world_of_one):
    model = build(tiny_model)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert all(isinstance(p, DTensor) for p in model.parameters()) and model.training
    buffers = dict(reference.named_buffers())
    assert all(torch.equal(b, buffers[name]) for name, b in model.named_buffers()), "rotary frequencies recomputed"
    assert model.lm_head.weight is model.model.embed_tokens.weight, "tied embeddings stay tied"
    assert model.generation_config.to_dict() == reference.generation_config.to_dict()
    ids = torch.tensor([[1, 17, 42, 99, 7, 3]])
    assert torch.equal(model(input_ids=ids).logits, reference(input_ids=ids).logits)


def test_a_bfloat16_checkpoint_becomes_float32_parameters(tiny_model, tmp_path, world_of_one):
    model_dir = tmp_path / "bf16"
    shutil.copytree(tiny_model, model_dir)
    weights = {k: v.bfloat16() for k, v in load_file(model_dir / "model.safetensors").items()}
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    model = build(model_dir)
    norm = model.model.norm.weight.full_tensor()
    assert norm.dtype == torch.float32 and torch.equal(norm, weights["model.norm.weight"].float())


def test_a_checkpoint_missing_a_weight_is_refused_by_name(tiny_model, tmp_path, world_of_one):
    model_dir = tmp_path / "partial"
    shutil.copytree(tiny_model, model_dir)
    weights = load_file(model_dir / "model.safetensors")
    del weights["model.norm.weight"]
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model.name: .* lacks weights for \['model.norm.weight'\]"):
        build(model_dir)


def test_a_model_without_safetensors_is_a_clear_error(tiny_model, tmp_path, world_of_one):
    model_dir = tmp_path / "bin"
    model_dir.mkdir()
    shutil.copy(tiny_model / "config.json", model_dir)
    with pytest.raises(FileNotFoundError, match="holds no \\*.safetensors"):
        build(model_dir)
