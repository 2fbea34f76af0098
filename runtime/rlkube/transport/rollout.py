"""A scored `Rollout` <-> its proto message, as env workers send them to the orchestrator.

Lossless for everything the orchestrator trains on: token ids, masks and logprobs travel as
packed int64/bool/double fields and an MoE sample's routing as a tensor, so a rollout decoded
here is equal to the one the worker built. The policy versions are the receiver's to set (the orchestrator's clock, see
`rlkube.orchestrator.workers`), and the advantage is computed after the whole group arrived.
"""

import torch

from rlkube.rollout_types import Rollout, Sample
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport.tensors import from_proto, to_proto


def to_message(rollout: Rollout) -> pb.RolloutResult:
    return pb.RolloutResult(
        env=rollout.env,
        example_id=rollout.example_id,
        reward=rollout.reward,
        samples=[
            pb.RolloutSample(
                token_ids=s.token_ids, loss_mask=s.loss_mask, logprobs=s.logprobs, temperature=s.temperature,
                policy_versions=s.policy_versions or [],
                routed_experts=None if s.routed_experts is None else to_proto(torch.from_numpy(s.routed_experts)),
            )
            for s in rollout.samples
        ],
        num_turns=rollout.num_turns,
        is_truncated=rollout.is_truncated,
        error=rollout.error,
        metrics=rollout.metrics,
        served_versions=rollout.served_versions,
    )


def from_message(message: pb.RolloutResult, policy_min: int, policy_max: int) -> Rollout:
    return Rollout(
        env=message.env,
        example_id=message.example_id,
        reward=message.reward,
        samples=[
            Sample(
                list(s.token_ids), list(s.loss_mask), list(s.logprobs), s.temperature,
                policy_versions=list(s.policy_versions) or None,
                routed_experts=from_proto(s.routed_experts).numpy() if s.HasField("routed_experts") else None,
            )
            for s in message.samples
        ],
        policy_min=policy_min,
        policy_max=policy_max,
        num_turns=message.num_turns,
        is_truncated=message.is_truncated,
        error=message.error if message.HasField("error") else None,
        metrics=dict(message.metrics),
        served_versions=list(message.served_versions),
    )
