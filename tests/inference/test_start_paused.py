"""`rlkube inference` starts with generation paused (real vLLM): requests wait until the
orchestrator's pool has loaded the current policy, tagged its version and resumed it; a fresh
run on a server that served another policy reloads the base model; and SIGTERM stops it even
while a request waits on something the stopped engine will never answer."""

import asyncio

import pytest
from rlkube.auth import http_headers
from rlkube.config import ClientConfig, InferenceConfig, SamplingConfig
from rlkube.http import async_client
from rlkube.inference.client import is_paused, update_weights, weight_version
from rlkube.inference.process import InferenceProcess
from rlkube.orchestrator.inference import InferencePool
from rlkube.scopes import ADMIN
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
            client.headers.update(http_headers(ADMIN))  # the run's token, as every caller sends it
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
        asyncio.run(_sigterm_with_a_request_waiting(server, str(tiny_model)))


async def _sigterm_with_a_request_waiting(server: InferenceProcess, model: str) -> None:
    """SIGTERM to the server alone (what a killed `rlkube rl` leaves it: `PR_SET_PDEATHSIG`,
    nobody to SIGKILL it after a grace period) while a weight load waits on a trainer that
    never answers, and the caller dies with the run: the server exits, instead of waiting in
    uvicorn's shutdown, forever, for a request the stopped engine will never answer."""
    import os
    import signal
    import socket
    import time

    with socket.socket() as silent_trainer:
        silent_trainer.bind(("127.0.0.1", 0))
        silent_trainer.listen()
        location = f"grpc://127.0.0.1:{silent_trainer.getsockname()[1]}"
        loading = asyncio.ensure_future(update_weights(server.base_url, 2, location, timeout=120))
        await asyncio.sleep(3)
        assert not loading.done(), "the load waits on the silent trainer"
        os.kill(server.process.pid, signal.SIGTERM)
        loading.cancel()  # the orchestrator dies with the run
        started = time.monotonic()
        code = await asyncio.to_thread(server.process.wait, 60)
    assert code is not None and time.monotonic() - started < 60
