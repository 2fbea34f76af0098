"""Tool lookup: an agentic, multi-turn, tool-using environment a tiny model can learn.

The user turn is a key (3-6 lowercase letters). The value stored under it (three digits) is
known only to the `lookup(key)` tool, so the model must call the tool, read its result, and
answer with it: two model turns with a tool message between them, e.g.

    user       bqxk
    assistant  <tool_call>\\n{"name": "lookup", "arguments": {"key": "bqxk"}}\\n</tool_call>
    tool       417
    assistant  417

Tool calls use Qwen3's `<tool_call>` JSON format, which the chat template renders and the
`renderers` Qwen3 renderer parses on the training client. The tool is a plain Python function
run by this module's in-process harness (`ToolLookupHarness`), not an MCP server, so the env
takes rlkube's lean rollout path (`rlkube.envs.in_process`) and needs no sandbox or `uv`.

Data is generated from a seed like reverse-text's (the same disjoint hash split of strings),
and `sft_examples` writes the SFT warm-up in the chat `messages` format `rlkube sft` reads
(`python -m rlkube.envs.tool_lookup --out FILE`).

    from rlkube.envs.tool_lookup import load_environment
    env = load_environment(split="test", num_examples=100)
"""

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.runtimes import ProgramResult

from rlkube.envs.chat_harness import opening_messages, post_chat
from rlkube.envs.reverse_text import GeneratedStringsConfig, generate_strings, parse_answer

TASKSET_ID = "rlkube_tool_lookup"
# verifiers resolves a taskset (and harness) id by importing a top-level module of that name
# (see rlkube.envs.reverse_text); the taskset's module exporting a Harness subclass makes it
# the taskset's default harness. The namespaced name spares the per-episode package search
# (see rlkube.envs.chat_harness).
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
sys.modules.setdefault(f"verifiers.v1.harnesses.{TASKSET_ID}", sys.modules[__name__])

TOOL_NAME = "lookup"
TOOL_SPEC = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "The value stored under a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
    },
}
LOOKUP_CREDIT = 0.25
"""Reward of a wrong answer after looking up the right key: the first half of the task done."""


def value_of(key: str) -> str:
    """The three-digit value stored under `key`: a hash, so no model can know it without the tool."""
    digest = hashlib.sha256(f"tool_lookup/{key}".encode()).digest()
    return f"{int.from_bytes(digest[:4], 'big') % 1000:03d}"


def key_argument(arguments: str) -> object:
    """The `key` of a call's raw JSON `arguments` (None when absent); ValueError when they are
    not a JSON object."""
    parsed = json.loads(arguments)  # a JSONDecodeError is a ValueError
    if not isinstance(parsed, dict):
        raise ValueError(f"not a JSON object: {arguments!r}")  # noqa: TRY004 - bad input, as json.loads says
    return parsed.get("key")


def lookup(arguments: str) -> str:
    """What the `lookup` tool answers to a call's raw JSON `arguments`: the value, or an error
    the model can read (keys are lowercase letters)."""
    try:
        key = key_argument(arguments)
    except ValueError:
        return f"error: arguments must be a JSON object with a key, got {arguments!r}"
    if not (isinstance(key, str) and key.isascii() and key.isalpha() and key.islower()):
        return f"error: no key {key!r}"
    return value_of(key)


def run_tool_call(call: dict) -> dict:
    """The tool message answering one wire tool call (an unknown tool is told so)."""
    function = call.get("function") or {}
    name = function.get("name")
    content = lookup(function.get("arguments") or "") if name == TOOL_NAME else f"error: unknown tool {name!r}"
    return {"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": content}


def looked_up_keys(messages: Iterable[vf.AssistantMessage]) -> list[str]:
    """The keys the model passed to `lookup`, in order (malformed calls skipped)."""
    keys = []
    for message in messages:
        for call in message.tool_calls or ():
            try:
                key = key_argument(call.arguments)
            except ValueError:
                continue
            if call.name == TOOL_NAME and isinstance(key, str):
                keys.append(key)
    return keys


def reward(answer: str, key: str, looked_up: list[str]) -> float:
    """1.0 for the right value (any `<think>` block dropped), `LOOKUP_CREDIT` for a wrong answer
    after looking up the right key, else 0.0."""
    if parse_answer(answer) == value_of(key):
        return 1.0
    return LOOKUP_CREDIT if key in looked_up else 0.0


def generate_keys(
    split: Literal["train", "test"], num_examples: int, seed: int = 0, min_len: int = 3, max_len: int = 6
) -> list[str]:
    """`num_examples` distinct keys of `split`: reverse-text's generator, so the splits are
    disjoint by construction and the same for the same arguments."""
    return generate_strings(split, num_examples, seed, min_len, max_len)


def sft_examples(
    split: Literal["train", "test"] = "train",
    num_examples: int = 10_000,
    seed: int = 0,
    min_len: int = 3,
    max_len: int = 6,
    tools_in_prompt: bool = False,
) -> list[dict]:
    """The SFT dataset: one `{"messages": [user, assistant tool call, tool, assistant]}` row per
    key (plus `"tools": [TOOL_SPEC]` when `tools_in_prompt`), the exchange a rollout records."""
    tools = {"tools": [TOOL_SPEC]} if tools_in_prompt else {}
    return [{"messages": solved_exchange(key), **tools} for key in generate_keys(split, num_examples, seed, min_len, max_len)]


def solved_exchange(key: str) -> list[dict]:
    """The conversation of a perfect policy on `key`, as chat wire messages."""
    call = {"id": "call_0", "type": "function", "function": {"name": TOOL_NAME, "arguments": {"key": key}}}
    return [
        {"role": "user", "content": key},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_0", "name": TOOL_NAME, "content": value_of(key)},
        {"role": "assistant", "content": value_of(key)},
    ]


class ToolLookupConfig(GeneratedStringsConfig):
    """Which keys the taskset yields and how the tool is offered."""

    min_len: int = Field(3, ge=1)
    """Shortest key."""
    max_len: int = Field(6, ge=1)
    """Longest key."""
    tools_in_prompt: bool = False
    """Declare `lookup` in the request (the chat template's tool block in the system turn).
    Off by default: the tiny example model does not read it, and it adds ~540 tokens of
    constant prompt to every sample (~5x the whole exchange). A model that reads needs it on,
    in SFT data and RL alike (the prompts must match)."""


class ToolLookupData(vf.TaskData):
    key: str
    """The key asked for (the user prompt)."""
    tools_in_prompt: bool = False
    """Whether the harness declares the tool in its requests (`ToolLookupConfig.tools_in_prompt`)."""


class ToolLookupTask(vf.Task[ToolLookupData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def answer(self, trace: vf.Trace) -> float:
        """The final reply against the stored value, with credit for looking up the right key."""
        return reward(trace.last_reply, self.data.key, looked_up_keys(trace.assistant_messages))


class ToolLookupTaskset(vf.Taskset[ToolLookupTask, ToolLookupConfig]):
    def load(self) -> Iterator[ToolLookupTask]:
        c = self.config
        for i, key in enumerate(generate_keys(c.split, c.num_examples, c.seed, c.min_len, c.max_len)):
            data = ToolLookupData(id=f"{c.split}-{c.seed}-{i}", prompt=key, key=key, tools_in_prompt=c.tools_in_prompt)
            yield ToolLookupTask(data, c.task)


class ToolLookupHarness(vf.Harness[vf.HarnessConfig]):
    """The tool loop, in-process: ask the model, run the tools it calls, hand back their
    results, until it replies without a tool call. Every model call goes through the rollout's
    interception (`post_chat`), which records the turns; the agent's `max_turns` ends a model
    that keeps calling tools (the refused call is a stop, not an error)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    IN_PROCESS = True
    """Runs no program: eligible for rlkube's lean rollout path (`rlkube.envs.in_process`)."""

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None) -> ProgramResult:
        messages = opening_messages(self, data)
        tools = {"tools": [TOOL_SPEC]} if data.tools_in_prompt else {}
        while True:
            status, text = await post_chat(endpoint, secret, {"model": ctx.model, "messages": messages, **tools})
            if status != 200:
                return ProgramResult(exit_code=1, stdout="", stderr=f"HTTP {status}: {text[-2000:]}")
            reply = json.loads(text)["choices"][0]["message"]
            messages.append(reply)
            if not reply.get("tool_calls"):
                return ProgramResult(exit_code=0, stdout=text, stderr="")
            messages.extend(run_tool_call(call) for call in reply["tool_calls"])


def load_environment(
    split: Literal["train", "test"] = "train",
    num_examples: int | None = None,
    seed: int = 0,
    min_len: int = 3,
    max_len: int = 6,
    tools_in_prompt: bool = False,
    max_turns: int = 3,
) -> vf.SingleAgentEnv:
    """The tool-lookup env, played by `ToolLookupHarness`. `max_turns` caps the model calls of a
    rollout (a lookup and an answer take 2). `num_examples` defaults to 10,000 for `train` and
    500 for `test`."""
    if num_examples is None:
        num_examples = 10_000 if split == "train" else 500
    taskset = ToolLookupConfig(
        id=TASKSET_ID, split=split, num_examples=num_examples, seed=seed, min_len=min_len, max_len=max_len,
        tools_in_prompt=tools_in_prompt,
    )
    agent = {"harness": {"id": TASKSET_ID}, "runtime": {"type": "subprocess"}, "max_turns": max_turns}
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=taskset, agent=agent))


def write_sft_jsonl(path: Path, **kwargs) -> int:
    """Write `sft_examples(**kwargs)` as JSON lines (what `[data] name = "<file>.jsonl"` reads);
    returns the row count."""
    rows = sft_examples(**kwargs)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    """`python -m rlkube.envs.tool_lookup --out FILE`: the SFT warm-up data as a .jsonl file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split", choices=["train", "test"], default="train")
    parser.add_argument("--num-examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tools-in-prompt", action="store_true")
    args = parser.parse_args(argv)
    count = write_sft_jsonl(
        args.out, split=args.split, num_examples=args.num_examples, seed=args.seed, tools_in_prompt=args.tools_in_prompt
    )
    print(f"wrote {count} rows to {args.out}")


__all__ = ["ToolLookupConfig", "ToolLookupData", "ToolLookupHarness", "ToolLookupTask", "ToolLookupTaskset"]


if __name__ == "__main__":
    main()

