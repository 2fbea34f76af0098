"""`weights.delta` through the real load path: a vLLM engine that loads a full snapshot and
then deltas (one of them missed) serves exactly what it serves from the full snapshot."""

import pytest
import torch
from rlkube.config import WeightTransferConfig
from rlkube.transport.publishers import make_publisher
from rlkube.transport.weights import StoragePublisher

from tests.inference.test_server import load, served
from tests.inference.weights import perturbed_state_dict

pytestmark = pytest.mark.slow


def nudged(state_dict: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """A copy with about 1 % of each tensor's elements moved: a delta's worth of change."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in state_dict.items():
        tensor = tensor.clone()
        flat = tensor.view(-1)
        picked = torch.randperm(flat.numel(), generator=generator)[: max(1, flat.numel() // 100)]
        flat[picked] += 0.5 * torch.randn(picked.numel(), generator=generator)
        out[name] = tensor
    return out


async def test_a_replica_that_missed_a_delta_serves_what_the_full_snapshot_serves(inference_server, tmp_path):
    base_url, model_dir = inference_server.base_url, inference_server.model
    policies = {1: perturbed_state_dict(model_dir, seed=5)}
    policies[2] = nudged(policies[1], seed=6)
    policies[3] = nudged(policies[2], seed=7)
    config = WeightTransferConfig(url=str(tmp_path / "delta"), delta={"full_every": 10})
    deltas = make_publisher(config, tmp_path, str(model_dir))
    full = StoragePublisher(str(tmp_path / "full"), str(model_dir), keep_last=None)
    locations = {step: deltas.publish(policy, step) for step, policy in policies.items()}
    assert (tmp_path / "delta" / "step_3" / "delta.safetensors").is_file()
    try:
        await load(base_url, 1, locations[1])
        first = await served(base_url)
        await load(base_url, 3, locations[3])  # missed 2: the worker reads delta 2, then 3
        via_deltas = await served(base_url)
        await load(base_url, 3, full.publish(policies[3], 3))
        via_full = await served(base_url)
    finally:
        await load(base_url, 0, inference_server.original_weights)
    assert via_deltas == via_full, "the deltas left other weights than the full snapshot"
    assert via_deltas != first
