"""A LoRA run's adapter-only snapshots in the real vLLM server, served both ways
(`trainer.lora.serving`): merged by the worker into the served model's own base weights, or
loaded as a vLLM LoRA adapter (a second server, started with `max_lora_rank`). Either way the
engine computes what the merged full weights, loaded the normal way, compute."""

import asyncio
import shutil

import httpx
import pytest
import torch
from rlkube import auth
from rlkube.config import InferenceConfig, LoraConfig
from rlkube.config.inference import POLICY_ADAPTER
from rlkube.inference import client
from rlkube.inference.process import InferenceProcess
from rlkube.models.lora_math import PEFT_PREFIX, merged_weights
from rlkube.scopes import ADMIN
from rlkube.trainer.lora import adapter_config
from rlkube.transport.weights import GrpcPublisher, StoragePublisher

from tests.fixtures.inference import free_port
from tests.inference.test_server import PROMPT_IDS, generate, load
from tests.inference.weights import original_state_dict

pytestmark = pytest.mark.slow

LORA = LoraConfig(rank=8, alpha=16.0)


def random_adapter(model_dir, seed: int = 0) -> dict[str, torch.Tensor]:
    """Non-zero A and B for every targeted projection, large enough to change greedy outputs."""
    generator = torch.Generator().manual_seed(seed)
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


@pytest.fixture(scope="module")
def lora_server(tiny_model, tmp_path_factory):
    """`rlkube inference` serving `tiny_model` with vLLM's LoRA support (`max_lora_rank`)."""
    yield from serve_lora(tiny_model, tmp_path_factory.mktemp("lora_server"))


def serve_lora(tiny_model, workdir, **settings):
    """Run `rlkube inference` on `tiny_model` with adapters of LORA's rank (and `settings`),
    yielding its base URL once healthy: the body of a module's engine fixture."""
    config = InferenceConfig.model_validate({
        "model": {"name": str(tiny_model)}, "port": free_port(), "kv_cache_space_gb": 1,
        "max_model_len": 512, "max_num_seqs": 8, "start_paused": False, "max_lora_rank": LORA.rank,
    } | settings)
    server = InferenceProcess(config, workdir)
    with server:
        try:
            asyncio.run(server.wait_until_healthy(timeout=600))
        except RuntimeError as e:
            pytest.fail(str(e))
        yield server.base_url


async def generate_as(base_url: str, model: str) -> tuple[list[int], list[float]]:
    """Greedy tokens and logprobs of the test prompt from the model (or adapter) named `model`."""
    body = {
        "model": model, "token_ids": PROMPT_IDS, "output_mode": "tokens",
        "sampling_params": {"max_tokens": 12, "temperature": 0.0, "ignore_eos": True, "logprobs": 1},
    }
    async with httpx.AsyncClient(timeout=120, headers=auth.http_headers(ADMIN)) as http:
        response = await http.post(f"{base_url}/inference/v1/generate", json=body)
    assert response.status_code == 200, response.text
    return tokens_and_logprobs(response.json())


async def load_adapter(base_url: str, step: int, location: str) -> None:
    await client.pause(base_url)
    try:
        await client.update_weights(base_url, step, location, timeout=120, as_adapter=True)
    finally:
        await client.resume(base_url)


async def test_an_adapter_served_with_vllms_lora_support_computes_its_merged_weights(lora_server, tiny_model, tmp_path):
    """Adapters loaded in place under one name, from storage and from gRPC, leave the base model
    as it was and serve what their merged weights serve; the engine does not read an adapter
    again from disk after its load (vLLM's own in-place route would, at every step)."""
    base_name = str(tiny_model)
    before = await generate_as(lora_server, base_name)
    first = random_adapter(tiny_model)
    second = {name: -tensor if ".lora_B." in name else tensor for name, tensor in first.items()}
    config = adapter_config(LORA, base_name)
    storage = StoragePublisher(str(tmp_path / "lora"), base_name, keep_last=2, adapter_config=config)
    grpc = GrpcPublisher("127.0.0.1", free_port(), base_name, keep_last=2, adapter_config=config)
    full = StoragePublisher(str(tmp_path / "full"), base_name, keep_last=2)
    try:
        await load_adapter(lora_server, 1, storage.publish(first, 1))
        from_first = await generate_as(lora_server, POLICY_ADAPTER)
        assert await client.weight_version(lora_server) == "1"
        assert (await generate_as(lora_server, base_name))[0] == before[0], "the base model is untouched"
        await load_adapter(lora_server, 2, grpc.publish(second, 2))
        from_second = await generate_as(lora_server, POLICY_ADAPTER)
        # The adapter's files where the server staged them, overwritten with the first one's:
        # the engine keeps serving the second adapter it loaded.
        async with httpx.AsyncClient(timeout=30, headers=auth.http_headers(ADMIN)) as http:
            cards = (await http.get(f"{lora_server}/v1/models")).json()["data"]
        staged = next(card["root"] for card in cards if card["id"] == POLICY_ADAPTER)
        first_files = storage.publish(first, 3)
        shutil.copyfile(f"{first_files}/adapter_model.safetensors", f"{staged}/adapter_model.safetensors")
        assert (await generate_as(lora_server, POLICY_ADAPTER))[0] == from_second[0]
        base = original_state_dict(tiny_model)
        await load(lora_server, 4, full.publish(base | merged_weights(base, second, LORA.scaling), 4))
        merged = await generate_as(lora_server, base_name)
    finally:
        grpc.close()
    assert from_first[0] != before[0] and from_second[0] != from_first[0], "each adapter changes the greedy output"
    assert merged[0] == from_second[0]
    assert merged[1] == pytest.approx(from_second[1], abs=1e-4)
