"""An in-process chat harness for verifiers environments: one model call per turn, no subprocess.

verifiers' `null` harness runs each rollout's chat loop as a separate Python program (a `uv`
script in a subprocess). That isolation buys nothing for plain chat tasks and costs about a
second of CPU per rollout: on a 2-core machine the orchestrator managed 0.8 rollouts/s against
an instant server with it, 7.7 rollouts/s with this harness. verifiers' `Harness.launch`
contract allows exactly this ("a harness may run its loop in-process ... as long as every
model call goes through `endpoint` + `secret`"): the interception server still records every
turn, so traces, token ids and logprobs are the same.

No tools: tasks that need tools or a sandbox keep a program harness. Multi-turn exchanges
(a user simulator, `resume`) work: each segment replays the conversation so far.
"""

import sys

import verifiers.v1 as vf
from verifiers.v1.dialects.chat import message_to_wire
from verifiers.v1.runtimes import ProgramResult

from rlkube.http import async_client

HARNESS_ID = "rlkube_chat"
# verifiers resolves a harness id by importing a top-level module of that name; register this
# module under it (as rlkube.envs.reverse_text does for its taskset).
sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])


class InProcessChatHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None) -> ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(message_to_wire(m) for m in prompt)
        async with async_client(timeout=None) as client:
            response = await client.post(
                endpoint.rstrip("/") + "/chat/completions",
                json={"model": ctx.model, "messages": messages},
                headers={"Authorization": f"Bearer {secret}"},
            )
        if response.status_code != 200:
            return ProgramResult(exit_code=1, stdout="", stderr=f"HTTP {response.status_code}: {response.text[-2000:]}")
        return ProgramResult(exit_code=0, stdout=response.text, stderr="")


__all__ = ["InProcessChatHarness"]
