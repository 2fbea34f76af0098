"""A micro-batch through its proto message and back, with and without the optional fields."""

import torch
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport.microbatch import from_message, to_message

from tests.transport.test_rollouts_grpc import random_micro_batch


def round_trip(micro_batch: dict) -> dict:
    wire = to_message(micro_batch, step=3, rank=1, index=0, count=2).SerializeToString()
    return from_message(pb.MicroBatch.FromString(wire))


def test_teacher_logprobs_round_trip_bit_exact():
    micro_batch = random_micro_batch(2, 16, seed=0)
    micro_batch["teacher_logprobs"] = -torch.rand(2, 16, generator=torch.Generator().manual_seed(1)) * 10
    back = round_trip(micro_batch)
    assert torch.equal(back["teacher_logprobs"], micro_batch["teacher_logprobs"])
    assert torch.equal(back["inference_logprobs"], micro_batch["inference_logprobs"])


def test_a_micro_batch_without_a_teacher_has_no_teacher_logprobs():
    assert "teacher_logprobs" not in round_trip(random_micro_batch(2, 16, seed=0))


def test_routed_experts_round_trip_bit_exact():
    micro_batch = random_micro_batch(2, 16, seed=0)
    micro_batch["routed_experts"] = torch.randint(-1, 128, (2, 16, 3, 2), dtype=torch.int16)
    assert torch.equal(round_trip(micro_batch)["routed_experts"], micro_batch["routed_experts"])
    assert "routed_experts" not in round_trip(random_micro_batch(2, 16, seed=0))
