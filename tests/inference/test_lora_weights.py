"""A LoRA run's adapter-only snapshots in the real vLLM server: the worker merges them into
the served model's own base weights, so the engine computes what the merged full weights,
loaded the normal way, compute."""

import pytest
import torch
from rlkube.config import LoraConfig
from rlkube.trainer.lora import PEFT_PREFIX, adapter_config, merged_weights
from rlkube.transport.weights import GrpcPublisher, StoragePublisher

from tests.fixtures.inference import free_port
from tests.inference.test_server import generate, load
from tests.inference.weights import original_state_dict

pytestmark = pytest.mark.slow

LORA = LoraConfig(rank=8, alpha=16.0)


def random_adapter(model_dir) -> dict[str, torch.Tensor]:
    """Non-zero A and B for every targeted projection, large enough to change greedy outputs."""
    generator = torch.Generator().manual_seed(0)
    adapter = {}
    for name, weight in original_state_dict(model_dir).items():
        module = name.removesuffix(".weight")
        if module.rpartition(".")[2] in LORA.target_modules:
            out_features, in_features = weight.shape
            adapter[f"{PEFT_PREFIX}{module}.lora_A.weight"] = 0.15 * torch.randn(LORA.rank, in_features, generator=generator)
            adapter[f"{PEFT_PREFIX}{module}.lora_B.weight"] = 0.15 * torch.randn(out_features, LORA.rank, generator=generator)
    return adapter


def tokens_and_logprobs(body: dict) -> tuple[list[int], list[float]]:
    choice = body["choices"][0]
    return choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


async def test_an_adapter_snapshot_serves_what_its_merged_weights_serve(inference_server, tmp_path):
    base_url, model = inference_server.base_url, inference_server.model
    before, _ = tokens_and_logprobs(await generate(base_url))
    adapter = random_adapter(model)
    base = original_state_dict(model)
    merged = base | merged_weights(base, adapter, LORA.scaling)
    config = adapter_config(LORA, str(model))
    lora_storage = StoragePublisher(str(tmp_path / "lora"), str(model), keep_last=2, adapter_config=config)
    lora_grpc = GrpcPublisher("127.0.0.1", free_port(), str(model), keep_last=2, adapter_config=config)
    full_storage = StoragePublisher(str(tmp_path / "full"), str(model), keep_last=2)
    try:
        await load(base_url, 11, lora_storage.publish(adapter, 11))
        from_adapter = tokens_and_logprobs(await generate(base_url))
        await load(base_url, 12, full_storage.publish(merged, 12))
        from_merged = tokens_and_logprobs(await generate(base_url))
        # merged into the ORIGINAL base again, not into the weights served at the time
        await load(base_url, 13, lora_grpc.publish(adapter, 13))
        from_grpc_adapter = tokens_and_logprobs(await generate(base_url))
    finally:
        lora_grpc.close()
        await load(base_url, 0, inference_server.original_weights)
    assert from_adapter[0] != before, "the adapter changes the greedy output"
    for served in (from_adapter, from_grpc_adapter):
        assert served[0] == from_merged[0]
        assert served[1] == pytest.approx(from_merged[1], abs=1e-4)
    assert tokens_and_logprobs(await generate(base_url))[0] == before
