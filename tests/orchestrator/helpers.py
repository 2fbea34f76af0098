"""Tiny fakes for orchestrator unit tests: rollouts without an engine."""

from rlkube.rollout_types import Rollout, Sample


def make_sample(prompt_len: int, completion_len: int, advantage: float = 0.0, temperature: float = 1.0) -> Sample:
    n = prompt_len + completion_len
    return Sample(
        token_ids=list(range(100, 100 + n)),
        loss_mask=[False] * prompt_len + [True] * completion_len,
        logprobs=[0.0] * prompt_len + [-0.5] * completion_len,
        temperature=temperature,
        advantage=advantage,
    )


def make_rollout(reward: float, policy_min: int = 0, completion_len: int = 4, example_id: str = "x", env: str = "e") -> Rollout:
    return Rollout(
        env=env,
        example_id=example_id,
        reward=reward,
        samples=[make_sample(3, completion_len)],
        policy_min=policy_min,
        policy_max=policy_min,
    )
