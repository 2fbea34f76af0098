"""The NCCL weight path (vLLM's weight-transfer engine): needs an NVIDIA GPU and the `vllm`
(CUDA) package; skipped elsewhere. The order of the calls around a broadcast is checked without
a GPU in tests/transport/test_nccl_order.py."""

import asyncio

import pytest
import torch
from rlkube.config import WeightTransferConfig

from tests.fixtures.inference import free_port
from tests.inference.test_server import generate, greedy_ids, load
from tests.inference.weights import perturbed_state_dict

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (NCCL weight transfer)"),
]


async def test_nccl_broadcast_changes_generations(inference_server):
    from rlkube.inference import client
    from rlkube.transport.publishers import make_publisher

    base_url = inference_server.base_url
    before = await greedy_ids(base_url)
    config = WeightTransferConfig(type="nccl", nccl_port=free_port(), inference_urls=[base_url])
    publisher = make_publisher(config, "unused", str(inference_server.model))
    try:
        location = publisher.publish(perturbed_state_dict(inference_server.model, seed=4), step=11)
        assert location.startswith("nccl://")
        await client.update_weights(base_url, 11, location)  # waits for the served version
        assert await greedy_ids(base_url) != before
    finally:
        publisher.close()
        await load(base_url, 0, inference_server.original_weights)
    assert await greedy_ids(base_url) == before


async def test_nccl_updates_with_requests_in_flight(inference_server):
    """Requests decoding while the trainer broadcasts are kept (paused, not aborted), and the
    weights they leave behind are exactly the broadcast ones: greedy output after two updates
    under load equals that of the same weights broadcast with nothing in flight."""
    from rlkube.inference import client
    from rlkube.transport.publishers import make_publisher

    base_url, model = inference_server.base_url, inference_server.model
    config = WeightTransferConfig(type="nccl", nccl_port=free_port(), inference_urls=[base_url])
    publisher = make_publisher(config, "unused", str(model))
    target = perturbed_state_dict(model, seed=4)
    try:
        publisher.publish(target, step=11)
        expected = await greedy_ids(base_url)
        in_flight = [asyncio.ensure_future(generate(base_url, max_tokens=1024)) for _ in range(8)]
        await asyncio.sleep(0.2)  # decoding
        await asyncio.to_thread(publisher.publish, perturbed_state_dict(model, seed=5), 12)
        await asyncio.to_thread(publisher.publish, target, 13)
        results = await asyncio.gather(*in_flight)
        assert all(len(r["choices"][0]["token_ids"]) == 1024 for r in results), "no request was aborted"
        assert await client.weight_version(base_url) == "13"
        assert await greedy_ids(base_url) == expected
    finally:
        publisher.close()
        await load(base_url, 0, inference_server.original_weights)
