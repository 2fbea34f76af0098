"""The tool-lookup environment: data, tool, reward, SFT rows, and its multi-turn tool-calling
rollouts through rlkube's rollout runner against the fake engine (token-exact, tool results
never trained on), down to the packed batch."""

import asyncio
import json
import re
from dataclasses import replace

import pytest
from rlkube.config import ClientConfig, EnvConfig, SamplingConfig, SFTDataConfig
from rlkube.envs import load_env
from rlkube.envs.reverse_text import split_of
from rlkube.envs.tool_lookup import (
    LOOKUP_CREDIT,
    TOOL_SPEC,
    generate_keys,
    looked_up_keys,
    lookup,
    reward,
    run_tool_call,
    sft_examples,
    solved_exchange,
    value_of,
    write_sft_jsonl,
)
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.packing import pack_batch
from rlkube.orchestrator.rollouts import EnvRunner
from verifiers.v1 import AssistantMessage
from verifiers.v1.types import ToolCall

from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


def test_keys_are_deterministic_distinct_and_of_the_requested_shape():
    keys = generate_keys("train", 500, seed=3)
    assert keys == generate_keys("train", 500, seed=3) != generate_keys("train", 500, seed=4)
    assert len(set(keys)) == 500
    assert all(3 <= len(k) <= 6 and k.isalpha() and k.islower() for k in keys)


def test_train_and_test_keys_never_overlap_whatever_the_seed():
    train = set(generate_keys("train", 3000, seed=0)) | set(generate_keys("train", 3000, seed=1))
    test = set(generate_keys("test", 300, seed=0)) | set(generate_keys("test", 300, seed=5))
    assert not train & test
    assert all(split_of(k) == "test" for k in test)


def test_values_are_three_digits_fixed_by_the_key():
    assert [value_of(k) for k in ("abc", "abc", "abd")] == ["784", "784", "863"]
    assert len({value_of(k) for k in generate_keys("train", 300)}) > 200


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"key": "abc"}', "784"),
        ('{"key": "ABC"}', "error: no key 'ABC'"),
        ('{"key": 7}', "error: no key 7"),
        ("{}", "error: no key None"),
        ('"abc"', "error: arguments must be a JSON object with a key, got '\"abc\"'"),
        ("{key: abc}", "error: arguments must be a JSON object with a key, got '{key: abc}'"),
    ],
)
def test_lookup_tool_answers_the_value_or_a_readable_error(arguments, expected):
    assert lookup(arguments) == expected


def test_tool_calls_become_tool_messages():
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "abc"}'}}
    assert run_tool_call(call) == {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "784"}
    other = run_tool_call({"id": "c2", "function": {"name": "search", "arguments": "{}"}})
    assert other["content"] == "error: unknown tool 'search'"


def test_looked_up_keys_reads_the_models_lookup_calls():
    def calls(*pairs):
        return AssistantMessage(tool_calls=[ToolCall(id=str(i), name=n, arguments=a) for i, (n, a) in enumerate(pairs)])

    messages = [
        calls(("lookup", '{"key": "abc"}'), ("search", '{"key": "zzz"}'), ("lookup", "not json")),
        AssistantMessage(content="784"),
        calls(("lookup", '{"key": "abd"}'), ("lookup", '{"key": 3}')),
    ]
    assert looked_up_keys(messages) == ["abc", "abd"]


@pytest.mark.parametrize(
    ("answer", "looked_up", "expected"),
    [
        ("784", ["abc"], 1.0),
        ("  784\n", [], 1.0),  # a lucky guess is still the right answer
        ("<think>\n\n</think>\n\n784", ["abc"], 1.0),
        ("785", ["abc"], LOOKUP_CREDIT),
        ("", ["abd", "abc"], LOOKUP_CREDIT),
        ("785", ["abd"], 0.0),
        ("784 ", ["abd"], 1.0),
        ("7840", [], 0.0),
    ],
)
def test_reward_is_the_exact_value_with_credit_for_the_right_lookup(answer, looked_up, expected):
    assert reward(answer, "abc", looked_up) == expected


def test_sft_rows_are_the_solved_exchange():
    rows = sft_examples("train", 5, seed=1)
    keys = generate_keys("train", 5, seed=1)
    assert [row["messages"] for row in rows] == [solved_exchange(k) for k in keys]
    user, call, tool, answer = rows[0]["messages"]
    assert user == {"role": "user", "content": keys[0]}
    assert call["tool_calls"][0]["function"] == {"name": "lookup", "arguments": {"key": keys[0]}}
    assert tool["content"] == answer["content"] == value_of(keys[0])
    assert "tools" not in rows[0]
    assert sft_examples("train", 1, tools_in_prompt=True)[0]["tools"] == [TOOL_SPEC]


def test_sft_jsonl_feeds_rlkube_sft_with_loss_on_the_models_turns_only(tiny_model, tmp_path):
    """The file `rlkube sft` reads: rendered by its tokenizer, the loss covers the tool call and
    the answer, never the tool result, and the call is one the rollout's renderer parses."""
    from rlkube.trainer.sft.data import ChatTokenizer, load_rows
    from transformers import AutoTokenizer

    path = tmp_path / "sft.jsonl"
    assert write_sft_jsonl(path, num_examples=3, seed=2) == 3
    rows = load_rows(SFTDataConfig(name=str(path)))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    tokenize = ChatTokenizer(tokenizer, str(tiny_model), ["assistant"])
    key = generate_keys("train", 3, seed=2)[0]
    sample = tokenize(rows[0])
    assert sample.input_ids == tokenize({"messages": solved_exchange(key)}).input_ids  # the file changes nothing
    trained = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])
    call = f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call><|im_end|>'
    assert trained == f"{call}<think>\n\n</think>\n\n{value_of(key)}<|im_end|>"
    untrained = tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if not m])
    assert f"<tool_response>\n{value_of(key)}\n</tool_response>" in untrained
    parsed = tokenize.renderer.parse_response(tokenizer.encode(call, add_special_tokens=False))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("lookup", {"key": key})]


def test_environment_yields_the_split_and_resolves_by_id():
    env = load_env(EnvConfig(id="tool_lookup", args={"split": "test", "num_examples": 4, "seed": 5}))
    tasks = list(env.taskset)
    assert [t.data.key for t in tasks] == [t.data.prompt for t in tasks] == generate_keys("test", 4, seed=5)
    assert not any(t.data.tools_in_prompt for t in tasks)
    # verifiers' own id resolution finds the taskset and, from the same module, its harness
    env = load_env(EnvConfig(id="rlkube_tool_lookup", args={"num_examples": 2, "tools_in_prompt": True}))
    assert all(t.data.tools_in_prompt for t in env.taskset)
    with pytest.raises(ValueError, match="env 'tool_lookup'.*splt"):
        load_env(EnvConfig(id="tool_lookup", args={"splt": "test"}))


class ScriptedModel:
    """A fake engine policy: a `lookup` call of the user's key, then `answer(tool result)`;
    records every prompt it was given and every completion it returned (the stop token is
    the fake's)."""

    def __init__(self, tokenizer, answer=lambda result: result, calls_tool: bool = True):
        self.tokenizer, self.answer, self.calls_tool = tokenizer, answer, calls_tool
        self.prompts: list[list[int]] = []
        self.completions: list[list[int]] = []

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        prompt = self.tokenizer.decode(prompt_ids)
        results = TOOL_RESPONSE.findall(prompt)
        if results or not self.calls_tool:
            text = self.answer(results[-1] if results else "")
        else:
            key = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt)[-1]
            text = f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'
        self.prompts.append(list(prompt_ids))
        self.completions.append(self.tokenizer.encode(text, add_special_tokens=False))
        return self.completions[-1]


def run_one_rollout(model_dir, policy, path: str = "lean", **args):
    from transformers import AutoTokenizer

    stop = AutoTokenizer.from_pretrained(model_dir).convert_tokens_to_ids("<|im_end|>")
    env_config = EnvConfig(id="tool_lookup", args={"num_examples": 4, **args}, rollout_path=path)
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    assert runner.rollout_path == path

    async def go(url):
        pool = InferencePool(ClientConfig(base_urls=[url]), str(model_dir), str(model_dir), SamplingConfig(max_tokens=96))
        async with runner.serving():
            example_id, task = runner.next_task()
            return task, await runner.rollout(task, example_id, pool.context_at(pool.base_urls[0]), 1.0, lambda: 0)

    with FakeInferenceThread(FakeInference(str(model_dir), stop, respond=policy)) as server:
        task, rollout = asyncio.run(go(server.url))
    return task.data.key, rollout, stop


@pytest.mark.parametrize("path", ["lean", "verifiers"])
def test_tool_call_rollout_is_one_token_exact_sample_without_loss_on_the_tool_result(tiny_model, path):
    """Turn 1 is a `lookup` call the renderer parses and the harness runs; turn 2 answers with
    its result. One sample: the ids are the engine's prompts and completions exactly, and the
    loss mask is true on the sampled tokens only (never on the tool message)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    policy = ScriptedModel(tokenizer)
    key, rollout, stop = run_one_rollout(tiny_model, policy, path)
    assert rollout.error is None and rollout.num_turns == 2
    assert rollout.reward == 1.0
    first_prompt, second_prompt = policy.prompts
    first, second = (c + [stop] for c in policy.completions)
    # the tool ran: its result (known only to the tool) is in the model's second prompt
    assert TOOL_RESPONSE.findall(tokenizer.decode(second_prompt)) == [value_of(key)]
    assert tokenizer.decode(policy.completions[1]) == value_of(key)

    (sample,) = rollout.samples
    assert second_prompt[: len(first_prompt) + len(first)] == first_prompt + first
    assert sample.token_ids == second_prompt + second
    tool_message = len(second_prompt) - len(first_prompt) - len(first)
    assert sample.loss_mask == [False] * len(first_prompt) + [True] * len(first) + [False] * tool_message + [True] * len(second)
    assert [t for t, m in zip(sample.token_ids, sample.loss_mask) if m] == first + second
    assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m] == [-0.25] * (len(first) + len(second))
    assert "<tool_response>" in tokenizer.decode(second_prompt[len(first_prompt) + len(first) :])

    # packed for the trainer (the prompt shared by a group of two), the tool message stays untrained
    (rank0,) = pack_batch([replace(sample), replace(sample)], seq_len=512, world_size=1)
    (micro_batch,) = rank0
    mask, segments = micro_batch["loss_mask"][0], micro_batch["sample_ids"][0]
    for segment in (0, 1):
        assert mask[segments == segment].tolist() == sample.loss_mask[len(first_prompt) :]
    assert mask[segments == 2].tolist() == [False] * len(first_prompt), "the shared prompt"
    assert micro_batch["global_loss_tokens"] == 2 * (len(first) + len(second))


@pytest.mark.parametrize(
    ("answer", "calls_tool", "turns", "expected"),
    [
        (lambda result: str((int(result) + 1) % 1000).zfill(3), True, 2, LOOKUP_CREDIT),  # a misread result
        (lambda result: "123", False, 1, 0.0),  # a guess without the tool
    ],
)
def test_rollout_reward_follows_the_policy(tiny_model, answer, calls_tool, turns, expected):
    from transformers import AutoTokenizer

    policy = ScriptedModel(AutoTokenizer.from_pretrained(tiny_model), answer, calls_tool)
    key, rollout, _ = run_one_rollout(tiny_model, policy)
    assert value_of(key) != "123"
    assert rollout.error is None and (rollout.num_turns, rollout.reward) == (turns, expected)


def test_a_model_that_only_calls_tools_is_stopped_by_max_turns(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    call = '<tool_call>\n{"name": "lookup", "arguments": {"key": "abc"}}\n</tool_call>'
    policy = lambda ids: tokenizer.encode(call, add_special_tokens=False)
    _, rollout, _ = run_one_rollout(tiny_model, policy, max_turns=2)
    assert rollout.error is None, "a stop, not a harness failure"
    assert rollout.num_turns == 2 and rollout.reward == 0.0


def test_tools_in_prompt_declares_the_tool_to_the_model(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    policy = ScriptedModel(tokenizer)
    _, rollout, _ = run_one_rollout(tiny_model, policy, tools_in_prompt=True)
    assert rollout.reward == 1.0
    assert json.dumps(TOOL_SPEC) in tokenizer.decode(policy.prompts[0])


@pytest.mark.parametrize("path", ["lean", "verifiers"])
def test_eval_saves_a_teachers_rollouts_as_the_sft_rows_of_a_solved_exchange(tiny_model, tmp_path, path):
    """SFT distillation's first half, `rlkube eval --save-samples` against a teacher: a rollout
    that solves the task becomes a row `rlkube sft` trains on exactly as the built-in solved
    exchange (same tokens, same loss mask), every rollout carries its reward, and
    `--samples-min-reward` keeps only those that reach it."""
    from rlkube.entrypoints.eval import main
    from rlkube.trainer.sft.data import ChatTokenizer, load_rows
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    solves = lambda value: int(value) % 2 == 1  # the teacher misreads even values
    teacher = ScriptedModel(tokenizer, answer=lambda value: value if solves(value) else "xyz")
    keys = generate_keys("train", 8, seed=3)
    assert {solves(value_of(k)) for k in keys} == {True, False}, "the data must hold both cases"

    def save(out, *extra):
        argv = [
            "--base-url", server.url, "--model.name", str(tiny_model), "--env.id", "tool_lookup",
            "--env.args", '{split = "train", num_examples = 8, seed = 3}', "--env.rollout-path", path,
            "--sampling.max-tokens", "96", "--save-samples", "--output-dir", str(out), *extra,
        ]
        assert main(argv) == 0
        return load_rows(SFTDataConfig(name=str(out / "samples.jsonl")))

    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with FakeInferenceThread(FakeInference(str(tiny_model), stop, respond=teacher)) as server:
        every = save(tmp_path / "all")
        kept = save(tmp_path / "kept", "--samples-min-reward", "1.0")

    key_of = lambda row: row["messages"][0]["content"]
    assert [(key_of(r), r["reward"]) for r in every] == [
        (k, 1.0 if solves(value_of(k)) else LOOKUP_CREDIT) for k in keys
    ]
    assert len({r["example"] for r in every}) == len(keys)
    assert [key_of(r) for r in kept] == [k for k in keys if solves(value_of(k))]
    tokenize = ChatTokenizer(tokenizer, str(tiny_model), ["assistant"])
    for row in kept:
        sample, gold = tokenize(row), tokenize({"messages": solved_exchange(key_of(row))})
        assert (sample.input_ids, sample.loss_mask) == (gold.input_ids, gold.loss_mask)
    wrong = next(r for r in every if r["reward"] < 1.0)
    assert wrong["messages"][-1] == {"role": "assistant", "content": "xyz"}
    assert wrong["messages"][2]["role"] == "tool" and wrong["messages"][2]["content"] == value_of(key_of(wrong))


def test_samples_min_reward_without_save_samples_is_refused():
    from rlkube.config import EvalRunConfig

    with pytest.raises(ValueError, match="samples_min_reward: .*save_samples is off"):
        EvalRunConfig(samples_min_reward=1.0)
