"""Tool chain: a multi-turn agentic environment whose tools take real, long-tailed time.

The user turn is a key of 4-5 lowercase letters. `lookup(key)` answers another key one letter
shorter, and a key of three letters holds a three-digit value (`tool_service.tools`): the
model must call the tool 2-3 times, copying each key it reads into the next call, then answer
with the value. The tool runs in the tool service, a separate process whose every call waits
a seeded lognormal latency (`rlkube tool-service`, `rlkube.envs.tool_service`):

    user       bqxk
    assistant  <tool_call>{"name": "lookup", "arguments": {"key": "bqxk"}}</tool_call>
    tool       mfp
    assistant  <tool_call>{"name": "lookup", "arguments": {"key": "mfp"}}</tool_call>
    tool       417
    assistant  417

Reward: 1.0 for the value; otherwise `CHAIN_CREDIT` times the share of the chain's keys the
model looked up (the part of the task done). A call past `tool_timeout_s` (or failed by the
service) is answered with a tool message saying so (`tool_service.client`): the model sees
it, may call again within `max_turns`, and the episode is scored on its answer as any other
(`on_timeout = "message"`, the default). With `on_timeout = "error"` a timed-out call fails
the rollout instead: it is counted as errored and never trained on. A service that cannot be
reached always fails the rollout. Each rollout's tool calls are recorded in its metrics
(`tool/calls`, `tool/timeouts`, `tool/errors`, `tool/retries`, the `tool/latency_s` histogram).

The harness runs in-process (`IN_PROCESS`), so rollouts take rlkube's lean path.

    rlkube tool-service --port 8790 &
    python -m rlkube.envs.tool_chain --out outputs/agentic_tail/sft.jsonl   # SFT warm-up rows
"""

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.runtimes import ProgramResult

from rlkube.envs.chat_harness import opening_messages, post_chat
from rlkube.envs.reverse_text import GeneratedStringsConfig, generate_strings, parse_answer
from rlkube.envs.tool_lookup import TOOL_NAME, looked_up_keys
from rlkube.envs.tool_service.client import TIMEOUT_MESSAGE, ToolCall, ToolClient
from rlkube.envs.tool_service.tools import chain, value_of
from rlkube.histogram import Histogram

TASKSET_ID = "rlkube_tool_chain"
# Registered as a top-level module for verifiers' id lookup (see rlkube.envs.tool_lookup).
sys.modules.setdefault(TASKSET_ID, sys.modules[__name__])
sys.modules.setdefault(f"verifiers.v1.harnesses.{TASKSET_ID}", sys.modules[__name__])

CHAIN_CREDIT = 0.25
"""Reward of a wrong answer after looking up the whole chain (less for part of it)."""
OnTimeout = Literal["message", "error"]


def reward(answer: str, key: str, looked_up: list[str]) -> float:
    """1.0 for the chain's value, else `CHAIN_CREDIT` x the share of its keys looked up."""
    keys = chain(key)
    if parse_answer(answer) == value_of(keys[-1]):
        return 1.0
    return CHAIN_CREDIT * sum(k in looked_up for k in keys) / len(keys)


def solved_exchange(key: str, timed_out: int | None = None) -> list[dict]:
    """The conversation of a perfect policy on `key` as chat wire messages; with `timed_out`,
    that call (0-based) first times out and is made again (what the SFT data teaches)."""
    messages: list[dict] = [{"role": "user", "content": key}]
    keys = chain(key)
    for i, k in enumerate(keys):
        answers = [TIMEOUT_MESSAGE] if i == timed_out else []
        answers.append(value_of(k) if k == keys[-1] else keys[i + 1])
        for content in answers:
            call = {"id": f"call_{len(messages)}", "type": "function", "function": {"name": TOOL_NAME, "arguments": {"key": k}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": call["id"], "name": TOOL_NAME, "content": content})
    messages.append({"role": "assistant", "content": value_of(keys[-1])})
    return messages


def sft_examples(split: Literal["train", "test"] = "train", num_examples: int = 10_000, seed: int = 0,
                 min_len: int = 4, max_len: int = 5, retry_every: int = 10) -> list[dict]:
    """One `{"messages": ...}` row per key; every `retry_every`-th row has one call time out
    and repeated (0: none)."""
    keys = generate_strings(split, num_examples, seed, min_len, max_len)
    return [
        {"messages": solved_exchange(key, (i // retry_every) % len(chain(key)) if retry_every and i % retry_every == 0 else None)}
        for i, key in enumerate(keys)
    ]


_CLIENTS: dict[tuple[str, float, int], ToolClient] = {}


def tool_client(url: str, timeout_s: float, max_concurrent: int) -> ToolClient:
    """One client (so one concurrency limit) per env setting in this process."""
    key = (url, timeout_s, max_concurrent)
    if key not in _CLIENTS:
        _CLIENTS[key] = ToolClient(url, timeout_s, max_concurrent)
    return _CLIENTS[key]


class ToolChainConfig(GeneratedStringsConfig):
    """Which keys the taskset yields and how the tool service is called."""

    min_len: int = Field(4, ge=3)
    """Shortest key (4: two lookups)."""
    max_len: int = Field(5, ge=3)
    """Longest key (5: three lookups)."""
    tool_url: str = "http://127.0.0.1:8790"
    """The tool service (`rlkube tool-service`)."""
    tool_timeout_s: float = Field(3.0, gt=0)
    """Per-call timeout: a call that has not answered by then is a timeout."""
    max_concurrent_calls: int = Field(64, ge=1)
    """Tool calls of this env in flight at once, per process (the rest wait their turn)."""
    on_timeout: OnTimeout = "message"
    """`message`: a timed-out call is a tool message the model reads and the episode goes on;
    `error`: it fails the rollout (errored, never trained on)."""


class ToolChainData(vf.TaskData):
    key: str
    tool_url: str
    tool_timeout_s: float
    max_concurrent_calls: int
    on_timeout: OnTimeout


class ToolChainTask(vf.Task[ToolChainData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def answer(self, trace: vf.Trace) -> float:
        """The final reply against the chain's value, with credit for the keys looked up."""
        return reward(trace.last_reply, self.data.key, looked_up_keys(trace.assistant_messages))


class ToolChainTaskset(vf.Taskset[ToolChainTask, ToolChainConfig]):
    def load(self) -> Iterator[ToolChainTask]:
        c = self.config
        for i, key in enumerate(generate_strings(c.split, c.num_examples, c.seed, c.min_len, c.max_len)):
            yield ToolChainTask(ToolChainData(
                id=f"{c.split}-{c.seed}-{i}", prompt=key, key=key, tool_url=c.tool_url, tool_timeout_s=c.tool_timeout_s,
                max_concurrent_calls=c.max_concurrent_calls, on_timeout=c.on_timeout,
            ), c.task)


class ToolTimedOut(RuntimeError):
    """A tool call timed out with `on_timeout = "error"`."""


def call_arguments(call: dict) -> object:
    """A wire tool call's arguments as JSON (the service refuses what is not an object)."""
    arguments = (call.get("function") or {}).get("arguments") or ""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class ToolChainHarness(vf.Harness[vf.HarnessConfig]):
    """The tool loop of `rlkube.envs.tool_lookup`, with the tool in the tool service; records
    the rollout's tool calls in its trace metrics."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    IN_PROCESS = True

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None) -> ProgramResult:
        client = tool_client(data.tool_url, data.tool_timeout_s, data.max_concurrent_calls)
        messages = opening_messages(self, data)
        calls: list[ToolCall] = []
        try:
            while True:
                status, text = await post_chat(endpoint, secret, {"model": ctx.model, "messages": messages})
                if status != 200:
                    return ProgramResult(exit_code=1, stdout="", stderr=f"HTTP {status}: {text[-2000:]}")
                reply = json.loads(text)["choices"][0]["message"]
                messages.append(reply)
                if not reply.get("tool_calls"):
                    return ProgramResult(exit_code=0, stdout=text, stderr="")
                for call in reply["tool_calls"]:
                    name = (call.get("function") or {}).get("name")
                    calls.append(result := await client.call(name, call_arguments(call)))
                    if result.outcome == "timeout" and data.on_timeout == "error":
                        raise ToolTimedOut(f"tool {name} timed out after {data.tool_timeout_s:g}s (on_timeout = 'error')")
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "name": name, "content": result.content})
        finally:
            trace.record_metrics(tool_call_metrics(calls))


def tool_call_metrics(calls: list[ToolCall]) -> dict[str, float]:
    """A rollout's tool calls as metrics: counts by outcome and the latency histogram."""
    latencies = Histogram("tool/latency_s")
    for call in calls:
        latencies.add(call.latency_s)
    return {
        "tool/calls": float(len(calls)),
        "tool/timeouts": float(sum(c.outcome == "timeout" for c in calls)),
        "tool/errors": float(sum(c.outcome == "error" for c in calls)),
        "tool/retries": float(sum(c.retries for c in calls)),
        **latencies.counts(),
    }


def load_environment(
    split: Literal["train", "test"] = "train",
    num_examples: int | None = None,
    seed: int = 0,
    min_len: int = 4,
    max_len: int = 5,
    tool_url: str = "http://127.0.0.1:8790",
    tool_timeout_s: float = 3.0,
    max_concurrent_calls: int = 64,
    on_timeout: OnTimeout = "message",
    max_turns: int = 6,
) -> vf.SingleAgentEnv:
    """The tool-chain env, played by `ToolChainHarness`. `max_turns` caps the model calls of a
    rollout (a 3-call chain and its answer take 4; two more leave room for timed-out calls).
    `num_examples` defaults to 10,000 for `train` and 500 for `test`."""
    if num_examples is None:
        num_examples = 10_000 if split == "train" else 500
    taskset = ToolChainConfig(
        id=TASKSET_ID, split=split, num_examples=num_examples, seed=seed, min_len=min_len, max_len=max_len,
        tool_url=tool_url, tool_timeout_s=tool_timeout_s, max_concurrent_calls=max_concurrent_calls, on_timeout=on_timeout,
    )
    agent = {"harness": {"id": TASKSET_ID}, "runtime": {"type": "subprocess"}, "max_turns": max_turns}
    return vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset=taskset, agent=agent))


def main(argv: list[str] | None = None) -> None:
    """`python -m rlkube.envs.tool_chain --out FILE`: the SFT warm-up data as a .jsonl file."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--split", choices=["train", "test"], default="train")
    parser.add_argument("--num-examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rows = sft_examples(args.split, args.num_examples, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} rows to {args.out}")


__all__ = ["ToolChainConfig", "ToolChainData", "ToolChainHarness", "ToolChainTask", "ToolChainTaskset"]


if __name__ == "__main__":
    main()
