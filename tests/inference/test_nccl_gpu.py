"""The NCCL weight path (vLLM's weight-transfer engine): needs an NVIDIA GPU and the `vllm`
(CUDA) package; skipped elsewhere."""

import pytest
import torch
from rlkube.config import WeightTransferConfig

from tests.fixtures.inference import free_port
from tests.inference.test_server import greedy_ids, load
from tests.inference.weights import perturbed_state_dict

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (NCCL weight transfer)"),
]


async def test_nccl_broadcast_changes_generations(inference_server):
    from rlkube.inference import client
    from rlkube.transport.weights import make_publisher

    base_url = inference_server.base_url
    before = await greedy_ids(base_url)
    config = WeightTransferConfig(type="nccl", nccl_port=free_port(), inference_urls=[base_url])
    publisher = make_publisher(config, "unused", str(inference_server.model))
    try:
        location = publisher.publish(perturbed_state_dict(inference_server.model, seed=4), step=11)
        assert location.startswith("nccl://")
        await client.update_weights(base_url, 11, location)  # checks the served version
        assert await greedy_ids(base_url) != before
    finally:
        publisher.close()
        await load(base_url, 0, inference_server.original_weights)
    assert await greedy_ids(base_url) == before
