"""The lean rollout path (in-process interception, `rlkube.envs.in_process`) records what
verifiers' full path records: the same trace graphs, token ids, masks, logprobs, rewards and
errors, on the same tasks against the same engine."""

import asyncio

import pytest
import verifiers.v1 as vf
from rlkube import withheld
from rlkube.config import EnvConfig, SamplingConfig
from rlkube.envs import load_env
from rlkube.envs.in_process import resolve_path, serving
from rlkube.envs.reverse_text import INSTRUCTION, TASKSET_ID, ReverseTextConfig
from rlkube.orchestrator.inference import model_contexts
from rlkube.orchestrator.rollouts import EnvRunner, episode_to_rollout

from tests.fixtures.inference import free_port
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread
from tests.orchestrator.test_rollouts import reverse_user_text


def node_view(node) -> tuple:
    return (node.parent, node.message.role, node.message.content, node.sampled, node.token_ids, node.mask, node.logprobs)


def trace_view(trace) -> dict:
    """Everything a trace records about the exchange (not ids or wall-clock times)."""
    return {
        "nodes": [node_view(n) for n in trace.nodes],
        "branches": [(b.token_ids, b.sampled_mask, b.logprobs, b.trainable) for b in trace.branches],
        "reward": trace.reward,
        "rewards": dict(trace.rewards),
        "metrics": dict(trace.metrics),
        "num_turns": trace.num_turns,
        "stop": trace.stop_condition,
        "ok": trace.ok,
        "errors": [(e.type, e.message) for e in trace.errors],
        "calls": [(c.node, c.model, c.finish_reason, c.usage, c.error and c.error.type) for c in trace.calls],
    }


async def episodes(env, path, tasks, url, model, sampling):
    (ctx,) = model_contexts([url], str(model), str(model), sampling, timeout_s=30)
    async with serving(env, path):
        first = await env.run_episode(tasks[0], ctx)  # see test_rollouts.run_rollouts
        return [first, *await asyncio.gather(*(env.run_episode(t, ctx) for t in tasks[1:]))]


def test_lean_path_records_the_same_traces_as_verifiers(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    env = load_env(EnvConfig(args={"num_examples": 6, "instruction": INSTRUCTION}))
    tasks = list(env.taskset)
    sampling = SamplingConfig(temperature=0.7, max_tokens=12)  # truncates the longer answers
    fake = FakeInference(str(tiny_model), stop, respond=reverse_user_text(tokenizer))
    with FakeInferenceThread(fake) as server:
        full = asyncio.run(episodes(env, "verifiers", tasks, server.url, tiny_model, sampling))
        lean = asyncio.run(episodes(env, "lean", tasks, server.url, tiny_model, sampling))
    assert fake.generate_requests == 2 * len(tasks)
    for a, b in zip(full, lean, strict=True):
        assert a.ok and b.ok
        assert [trace_view(t) for t in a.traces] == [trace_view(t) for t in b.traces]
        ra, rb = (episode_to_rollout(e, "reverse_text", "x", 0.7, 0, 0) for e in (a, b))
        assert ra == rb and len(ra.samples) == 1
    # the comparison has teeth: perfect answers, truncated ones, a system prompt, real logprobs
    rewards = [e.traces[0].reward for e in lean]
    assert 1.0 in rewards and min(rewards) < 1.0
    assert all(e.traces[0].nodes[0].message.role == "system" for e in lean)


def test_both_paths_send_the_withheld_token(tiny_model, monkeypatch):
    """The orchestrator took its credentials out of its environment (`rlkube.withheld`):
    verifiers' clients still present the generate one to inference, on both paths, from the
    process's memory."""
    monkeypatch.delenv(withheld.TOKEN_ENV, raising=False)
    monkeypatch.setattr(withheld, "_held", {"RLKUBE_TOKEN_GENERATE": "held-credential"})
    env = load_env(EnvConfig(args={"num_examples": 2}))
    fake = FakeInference(str(tiny_model), 0)
    with FakeInferenceThread(fake) as server:
        for path in ("verifiers", "lean"):
            asyncio.run(episodes(env, path, list(env.taskset), server.url, tiny_model, SamplingConfig(max_tokens=4)))
    assert fake.authorizations == ["Bearer held-credential"] * 4


def test_lean_path_fails_a_rollout_like_verifiers_when_the_engine_is_down(tiny_model):
    env = load_env(EnvConfig(args={"num_examples": 1}))
    tasks = list(env.taskset)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    full = asyncio.run(episodes(env, "verifiers", tasks, url, tiny_model, SamplingConfig(max_tokens=8)))
    lean = asyncio.run(episodes(env, "lean", tasks, url, tiny_model, SamplingConfig(max_tokens=8)))
    for episode in (*full, *lean):
        rollout = episode_to_rollout(episode, "reverse_text", "x", 1.0, 0, 0)
        assert not episode.ok and rollout.error and not rollout.samples
    assert [e.traces[0].calls[0].error.type for e in lean] == [e.traces[0].calls[0].error.type for e in full]


def test_program_harnesses_keep_the_verifiers_path():
    program = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(
        taskset=ReverseTextConfig(id=TASKSET_ID, num_examples=2),
        agent={"harness": {"id": "null"}, "runtime": {"type": "subprocess"}},
    ))
    assert resolve_path(program, "auto") == "verifiers"
    with pytest.raises(ValueError, match="env 'prog': rollout_path 'lean'.*harness 'null'"):
        EnvRunner(EnvConfig(name="prog", rollout_path="lean"), program, seed=0)
    chat = load_env(EnvConfig())
    assert resolve_path(chat, "auto") == "lean" and resolve_path(chat, "verifiers") == "verifiers"
