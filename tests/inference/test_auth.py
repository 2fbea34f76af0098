"""The real `rlkube inference` server (the session's shared one, started with the run token)
refuses every route but the probes' and the scraper's to a caller without the token: vLLM's
/v1 routes, its admin routes (`/collective_rpc` would load any weights) and rlkube's own."""

import httpx
import pytest
from rlkube import auth
from rlkube.inference import client
from rlkube.scopes import ADMIN

pytestmark = pytest.mark.slow

GUARDED = [
    ("POST", "/collective_rpc", {"json": {"method": "reload_weights", "kwargs": {"weights_path": "/nowhere"}}}),
    ("POST", "/pause", {"params": {"mode": "abort"}}),
    ("POST", "/reset_prefix_cache", {}),
    ("POST", "/update_weight_version", {"json": {"new_version": "666"}}),
    ("POST", "/v1/completions", {"json": {"prompt": "a", "max_tokens": 1}}),
    ("POST", "/inference/v1/generate", {"json": {"token_ids": [40], "sampling_params": {"max_tokens": 1}}}),
    ("POST", "/rlkube/load_lora_adapter", {"params": {"location": "/nowhere", "step": "1"}}),
    ("GET", "/is_paused", {}),
    ("GET", "/v1/models", {}),
]


async def test_without_the_token_only_health_and_metrics_answer(inference_server):
    url = inference_server.base_url
    version = await client.weight_version(url)
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            for headers in ({}, {"Authorization": "Bearer not-the-token"}, {"Authorization": auth.run_token()}):
                for method, route, kwargs in GUARDED:
                    response = await http.request(method, url + route, headers=headers, **kwargs)
                    assert response.status_code == 401, f"{method} {route} with {headers}: {response.status_code}"
            assert (await http.get(url + "/health")).status_code == 200
            assert (await http.get(url + "/metrics")).status_code == 200
            ok = await http.get(url + "/is_paused", headers=auth.http_headers(ADMIN))
            assert ok.status_code == 200 and ok.json()["is_paused"] is False, "a refused /pause paused the server"
        assert await client.weight_version(url) == version, "a refused request changed the weight version"
        assert (await client.post(url, "/v1/completions", 60, json={
            "model": inference_server.model_name, "prompt": "a", "max_tokens": 1})).status_code == 200
    finally:
        await client.resume(url)  # whatever a broken guard let through, later tests get a serving server

