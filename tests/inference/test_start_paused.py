"""`rlkube inference` starts with generation paused (real vLLM): requests wait until the
orchestrator's pool has loaded the current policy, tagged its version and resumed it; a fresh
run on a server that served another policy reloads the base model."""

import asyncio

import pytest
from rlkube.auth import http_headers
from rlkube.config import ClientConfig, InferenceConfig, SamplingConfig
from rlkube.http import async_client
from rlkube.inference.client import is_paused, weight_version
from rlkube.inference.process import InferenceProcess
from rlkube.orchestrator.inference import InferencePool
from rlkube.transport.weights_snapshot import Snapshot
from rlkube.transport.weights_storage import write_snapshot

from tests.fixtures.inference import free_port

pytestmark = pytest.mark.slow


def test_a_server_starts_paused_until_the_pool_syncs_it(tiny_model, tmp_path):
    from safetensors.torch import load_file

    config = InferenceConfig.model_validate({
        "model": {"name": str(tiny_model)}, "port": free_port(), "kv_cache_space_gb": 1,
        "max_model_len": 512, "max_num_seqs": 8,
    })
    assert config.start_paused, "paused by default"
    state_dict = load_file(tiny_model / "model.safetensors")
    policy_1 = write_snapshot(str(tmp_path / "weights"), Snapshot(state_dict, 1, tiny_model))

    async def scenario(url: str) -> None:
        assert await is_paused(url) and await weight_version(url) == "default"
        async with async_client(120) as client:
            client.headers.update(http_headers())  # the run's token, as every caller sends it
            request = {"model": str(tiny_model), "prompt": "abc", "max_tokens": 2}
            completion = asyncio.ensure_future(client.post(f"{url}/v1/completions", json=request))
            await asyncio.sleep(2)
            assert not completion.done(), "nothing is generated before the sync"
            pool = InferencePool(ClientConfig(base_urls=[url]), str(tiny_model), str(tiny_model), SamplingConfig())
            assert await pool.sync((1, policy_1), 120) == [url]
            assert not await is_paused(url) and await weight_version(url) == "1"
            response = await completion
            assert response.status_code == 200 and response.json()["choices"]
            # A fresh run on this server (kept running) reloads the model's own weights.
            assert await pool.sync((0, None), 120, fresh=True) == [url]
            assert not await is_paused(url) and await weight_version(url) == "0"
            response = await client.post(f"{url}/v1/completions", json=request)
        assert response.status_code == 200 and response.json()["choices"]

    with InferenceProcess(config, tmp_path) as server:
        asyncio.run(server.wait_until_healthy())
        asyncio.run(scenario(server.base_url))
