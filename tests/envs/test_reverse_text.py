"""The reverse-text environment: deterministic disjoint data, reward, verifiers wiring."""

import asyncio

import pytest
import verifiers.v1 as vf
from rlkube.config import EnvConfig
from rlkube.envs import load_env
from rlkube.envs.reverse_text import (
    INSTRUCTION,
    generate_strings,
    load_environment,
    parse_answer,
    reward,
    sft_examples,
    split_of,
)
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, TraceTask


def test_generation_is_deterministic_and_seeded():
    assert generate_strings("train", 50, seed=3) == generate_strings("train", 50, seed=3)
    assert generate_strings("train", 50, seed=3) != generate_strings("train", 50, seed=4)
    # a larger request extends a smaller one (the same stream)
    assert generate_strings("train", 80, seed=3)[:50] == generate_strings("train", 50, seed=3)


def test_strings_have_the_requested_shape():
    strings = generate_strings("train", 500, min_len=5, max_len=20)
    assert len(set(strings)) == 500
    assert all(5 <= len(s) <= 20 and s.isalpha() and s.islower() for s in strings)
    assert {len(s) for s in strings} == set(range(5, 21))
    short = generate_strings("test", 20, min_len=3, max_len=3)
    assert all(len(s) == 3 for s in short)


def test_train_and_test_never_overlap_whatever_the_seed():
    train = set(generate_strings("train", 3000, seed=0)) | set(generate_strings("train", 3000, seed=1))
    test = set(generate_strings("test", 300, seed=0)) | set(generate_strings("test", 300, seed=7))
    assert not train & test
    assert all(split_of(s) == "test" for s in test)


def test_impossible_requests_fail_clearly():
    with pytest.raises(ValueError, match="min_len <= max_len"):
        generate_strings("train", 5, min_len=6, max_len=5)
    with pytest.raises(ValueError, match="cannot draw 100 distinct test strings"):
        generate_strings("test", 100, min_len=1, max_len=1)  # only 26 one-letter strings exist


@pytest.mark.parametrize(
    ("completion", "text", "expected"),
    [
        ("cba", "abc", 1.0),
        ("  cba\n", "abc", 1.0),
        ("<think>\nhmm\n</think>\n\ncba", "abc", 1.0),
        ("abc", "abc", 1 / 3),  # SequenceMatcher: one matching char of 3+3 -> 2*1/6
        ("", "abc", 0.0),
        ("xyz", "abc", 0.0),
        ("cb", "abc", 0.8),
    ],
)
def test_reward_is_sequence_matcher_ratio_against_the_reversal(completion, text, expected):
    assert reward(completion, text) == pytest.approx(expected)


def test_parse_answer_drops_think_blocks():
    assert parse_answer("<think>a</think> x <think>b</think>") == "x"


def test_sft_examples_are_chat_messages_with_the_reversal():
    rows = sft_examples("train", 10, seed=0)
    assert len(rows) == 10
    for row, text in zip(rows, generate_strings("train", 10, seed=0)):
        user, assistant = row["messages"]
        assert user == {"role": "user", "content": text}
        assert assistant == {"role": "assistant", "content": text[::-1]}


def test_sft_examples_start_with_the_instruction_when_given():
    rows = sft_examples("train", 3, seed=0, instruction=INSTRUCTION)
    assert all(row["messages"][0] == {"role": "system", "content": INSTRUCTION} for row in rows)
    assert [len(row["messages"]) for row in rows] == [3, 3, 3]


def test_environment_is_a_verifiers_env_with_the_split_data():
    env = load_environment(split="test", num_examples=7, seed=2)
    assert isinstance(env, vf.Env)
    tasks = list(env.taskset)
    assert [t.data.text for t in tasks] == generate_strings("test", 7, seed=2)
    assert all(t.data.prompt == t.data.text and t.data.system_prompt is None for t in tasks)
    assert len({t.key for t in tasks}) == 7


def test_environment_instruction_is_every_tasks_system_prompt():
    env = load_environment(split="test", num_examples=3, instruction=INSTRUCTION)
    assert [t.data.system_prompt for t in env.taskset] == [INSTRUCTION] * 3


def _trace_replying(task, reply: str) -> vf.Trace:
    nodes = [
        MessageNode(message=vf.UserMessage(content=task.data.prompt)),
        MessageNode(parent=0, message=vf.AssistantMessage(content=reply), sampled=True),
    ]
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=nodes,
    )


@pytest.mark.parametrize("reply_of", [lambda s: s[::-1], lambda s: s[::-1][:-2], lambda s: s])
def test_task_scoring_through_verifiers_records_the_reward(reply_of):
    task = next(iter(load_environment(split="test", num_examples=1).taskset))
    trace = _trace_replying(task, reply_of(task.data.text))
    asyncio.run(task.score(trace))
    assert trace.reward == pytest.approx(reward(reply_of(task.data.text), task.data.text))
    assert set(trace.rewards) == {"reversed_ratio"}


def test_load_env_resolves_the_builtin_id_with_args():
    env = load_env(EnvConfig(id="reverse_text", args={"split": "test", "num_examples": 4, "seed": 5}))
    assert [t.data.text for t in env.taskset] == generate_strings("test", 4, seed=5)


def test_load_env_names_bad_args():
    with pytest.raises(ValueError, match="env 'reverse_text'.*splt"):
        load_env(EnvConfig(id="reverse_text", args={"splt": "test"}))


def test_load_env_goes_through_verifiers_for_other_ids():
    # The taskset id verifiers itself resolves for reverse-text (no rlkube shortcut).
    env = load_env(EnvConfig(id="rlkube_reverse_text", args={"split": "test", "num_examples": 2}))
    assert [t.data.text for t in env.taskset] == generate_strings("test", 2)
    with pytest.raises(ModuleNotFoundError, match="no_such_taskset"):
        load_env(EnvConfig(id="no_such_taskset"))
