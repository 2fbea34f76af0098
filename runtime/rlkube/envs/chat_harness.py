"""An in-process chat harness for verifiers environments: one model call per turn, no subprocess.

verifiers' `null` harness runs each rollout's chat loop as a separate Python program (a `uv`
script in a subprocess). That isolation buys nothing for plain chat tasks and costs about a
second of CPU per rollout: on a 2-core machine the orchestrator managed 0.8 rollouts/s against
an instant server with it, 7.7 rollouts/s with this harness. verifiers' `Harness.launch`
contract allows exactly this ("a harness may run its loop in-process ... as long as every
model call goes through `endpoint` + `secret`"): the interception server still records every
turn, so traces, token ids and logprobs are the same.

It declares `IN_PROCESS`, so rlkube serves its envs on the lean path
(`rlkube.envs.in_process`): the model call goes to the interception handler by function call
instead of over local HTTP. On verifiers' full path (`rollout_path = "verifiers"`) it posts to
the interception server as a program would.

No tools: tasks that need MCP tools or a sandbox keep a program harness (an env whose tools are
plain Python functions can run its own tool loop in-process, as `rlkube.envs.tool_lookup`
does with `opening_messages` and `post_chat`). Multi-turn exchanges (a user simulator,
`resume`) work: each segment replays the conversation so far.
"""

import sys

import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult

from rlkube.envs.in_process import in_process_interception
from rlkube.http import async_client

HARNESS_ID = "rlkube_chat"
CHAT_ROUTE = "/v1/chat/completions"
# verifiers resolves a harness id by importing a top-level module of that name; register this
# module under it (as rlkube.envs.reverse_text does for its taskset). Every episode builds its
# agents afresh and resolves the id again, asking first for a built-in harness of that name
# (`importlib.util.find_spec("verifiers.v1.harnesses.rlkube_chat")`), a search of verifiers'
# package directory each time (~60 us per rollout) that finds nothing. Registering the module
# under that name too answers it from `sys.modules`: the same module, so the same class.
# verifiers lists its built-in harnesses from the package directory, so the list is unchanged.
sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])
sys.modules.setdefault(f"verifiers.v1.harnesses.{HARNESS_ID}", sys.modules[__name__])


class InProcessChatHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False
    IN_PROCESS = True
    """Runs no program and reaches the model only through `endpoint` + `secret`: eligible for
    rlkube's lean rollout path (`rlkube.envs.in_process`)."""

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None) -> ProgramResult:
        body = {"model": ctx.model, "messages": opening_messages(self, data)}
        status, text = await post_chat(endpoint, secret, body)
        if status != 200:
            return ProgramResult(exit_code=1, stdout="", stderr=f"HTTP {status}: {text[-2000:]}")
        return ProgramResult(exit_code=0, stdout=text, stderr="")


def opening_messages(harness: vf.Harness, data: vf.TaskData) -> list[dict]:
    """The conversation a task opens with, as chat-completions wire messages."""
    system, prompt = harness.resolve_prompt(data)
    messages = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    elif prompt:
        messages.extend(message_to_wire(m) for m in prompt)
    return messages


async def post_chat(endpoint: str, secret: str, body: dict) -> tuple[int, str]:
    """(HTTP status, response text) of one chat completion posted to a rollout's `endpoint`:
    by function call on the lean path, over HTTP to verifiers' interception server otherwise."""
    if (interception := in_process_interception(endpoint)) is not None:  # the lean path
        status, content = await interception.post(CHAT_ROUTE, secret, body)
        return status, content.decode()
    async with async_client(timeout=None) as client:
        response = await client.post(
            endpoint.rstrip("/") + "/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"}
        )
    return response.status_code, response.text


__all__ = ["InProcessChatHarness", "opening_messages", "post_chat"]
