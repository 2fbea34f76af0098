"""Partial rollouts and the staleness bound in tokens.

A multi-turn rollout in flight when the policy updates continues on the new policy (the pool
pauses with `keep`, loads, resumes): its tokens carry the version that sampled each of them,
and the trainer's batch has each token's behaviour logprob from its own policy. The buffer's
bound (`max_off_policy_steps`) drops exactly the tokens past it (`off_policy_drop = "token"`),
or the whole rollout that has one (`rollout`), and counts them."""

import asyncio

import pytest
from rlkube.config import ClientConfig, EnvConfig, SamplingConfig
from rlkube.envs import load_env
from rlkube.histogram import Histogram
from rlkube.orchestrator.buffer import RolloutBuffer
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.packing import pack_batch
from rlkube.orchestrator.rollouts import EnvRunner
from rlkube.rollout_types import Rollout, Sample

from tests.envs.test_tool_service import ChainModel, ToolService
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

OLD, NEW = -0.25, -1.5
"""The fake engine's logprob of every token under the base model and under policy 1."""


def test_a_rollout_spanning_a_weight_update_trains_with_both_policies_logprobs(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    fake = FakeInference(str(tiny_model), stop, respond=ChainModel(tokenizer),
                         logprob=lambda version: OLD if version == "default" else NEW)

    async def go(url, service_url):
        env_config = EnvConfig(id="tool_chain", args={"num_examples": 4, "min_len": 4, "max_len": 4, "tool_url": service_url})
        runner = EnvRunner(env_config, load_env(env_config), seed=0)
        pool = InferencePool(ClientConfig(base_urls=[url]), str(tiny_model), str(tiny_model), SamplingConfig(max_tokens=96))
        clock = [0]
        async with runner.serving():
            example_id, task = runner.next_task()
            rollout = asyncio.ensure_future(
                runner.rollout(task, example_id, pool.context_at(url), 1.0, lambda: clock[0]))
            while fake.generate_requests < 1:  # turn 1 sampled; its tool call waits in the service
                await asyncio.sleep(0.01)
            await pool.load_policy(1, "/w/step_1", 60)  # pause (keep), load, tag "1", resume
            clock[0] = 1
            return await rollout

    with ToolService(p50_s=0.5, tail_ratio=1.0) as service, FakeInferenceThread(fake) as server:
        rollout = asyncio.run(go(server.url, service.url))
    assert rollout.error is None and rollout.reward == 1.0 and rollout.num_turns == 3
    assert fake.generated_versions == ["default", "1", "1"], "turn 1 on the base model, turns 2-3 on policy 1"
    assert (rollout.policy_min, rollout.policy_max) == (0, 1)
    (sample,) = rollout.samples
    sampled = [i for i, m in enumerate(sample.loss_mask) if m]
    versions = [sample.policy_versions[i] for i in sampled]
    logprobs = [sample.logprobs[i] for i in sampled]
    first_turn = versions.count(0)
    assert first_turn > 0 and versions == [0] * first_turn + [1] * (len(sampled) - first_turn)
    assert logprobs == [OLD] * first_turn + [NEW] * (len(sampled) - first_turn)
    assert all(v == -1 for i, v in enumerate(sample.policy_versions) if not sample.loss_mask[i])

    # The trainer's batch carries each token's behaviour logprob from the policy that sampled it.
    sample.advantage = 1.0
    (rank0,) = pack_batch([sample], seq_len=1024, world_size=1)
    (micro_batch,) = rank0
    trained = micro_batch["inference_logprobs"][micro_batch["loss_mask"]].tolist()
    assert trained == logprobs

    # Batch 2 (trainer at policy 1): the first turn is one version behind, the rest on-policy.
    buffer = RolloutBuffer(batch_size=1, max_off_policy_steps=1)
    buffer.add_group([rollout])
    batch = buffer.take_batch(2)
    lag = Histogram("off_policy/token_lag")
    lag.add_counts(batch.metrics)
    assert lag.buckets[:2] == [len(sampled) - first_turn, first_turn] and lag.count == len(sampled)


def rollout_of(versions: list[list[int]], policy_min: int = 0) -> Rollout:
    """A rollout of one sample per list: a 2-token prompt, then one sampled token per version."""
    samples = [
        Sample(token_ids=list(range(2 + len(vs))), loss_mask=[False, False] + [True] * len(vs),
               logprobs=[0.0, 0.0] + [-0.5] * len(vs), temperature=1.0, advantage=1.0,
               policy_versions=[-1, -1, *vs])
        for vs in versions
    ]
    return Rollout("env", "x", 1.0, samples, policy_min, max(max(vs) for vs in versions), advantage=1.0)


def test_the_staleness_bound_drops_exactly_the_tokens_past_it():
    """Batch 5: the trainer holds policy 4; with a bound of 2, versions 0 and 1 are past it."""
    spanning = rollout_of([[0, 0, 1, 2, 3], [3, 4]])
    fresh = rollout_of([[3, 3, 4]], policy_min=3)
    stale = rollout_of([[0, 1]])
    buffer = RolloutBuffer(batch_size=2, max_off_policy_steps=2, drop="token")
    buffer.add_group([spanning, stale])
    buffer.add_group([fresh])
    batch = buffer.take_batch(5)
    assert batch.rollouts == [spanning, fresh], "a rollout with no token left is dropped"
    assert [s.policy_versions for s in spanning.samples] == [[-1, -1, 0, 0, 1, 2, 3], [-1, -1, 3, 4]]
    assert [s.loss_mask for s in spanning.samples] == [[False] * 5 + [True] * 2, [False] * 2 + [True] * 2]
    assert fresh.samples[0].loss_mask == [False, False, True, True, True]
    assert batch.metrics["off_policy/dropped_tokens"] == 3 + 2 and batch.metrics["off_policy/dropped_rollouts"] == 1
    lag = Histogram("off_policy/token_lag")
    lag.add_counts(batch.metrics)
    assert lag.count == 2 + 2 + 3 and lag.max == 2, "only the tokens within the bound are trained"


@pytest.mark.parametrize(("bound", "dropped"), [(3, True), (4, False)])
def test_with_drop_rollout_a_rollout_with_a_token_past_the_bound_is_dropped_whole(bound, dropped):
    spanning = rollout_of([[0, 3, 4]])
    fresh = rollout_of([[3, 4]], policy_min=3)
    buffer = RolloutBuffer(batch_size=1, max_off_policy_steps=bound, drop="rollout")
    buffer.add_group([spanning])
    buffer.add_group([fresh])
    batch = buffer.take_batch(5)
    assert batch.rollouts == ([fresh] if dropped else [spanning])
    assert spanning.samples[0].loss_mask == [False, False, True, True, True], "whole or not at all"
    assert batch.metrics["off_policy/dropped_tokens"] == (3 if dropped else 0)
