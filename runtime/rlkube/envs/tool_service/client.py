"""How an environment calls the tool service: bounded in time and in concurrency, recorded.

`ToolClient.call(name, arguments)` posts one call and returns a `ToolCall`: the text the
model reads and the call's outcome and latency. The rule for a call that does not answer:

- past `timeout_s` it is a `timeout`: the model reads `TIMEOUT_MESSAGE` and the episode goes
  on (the model may call again, within the agent's `max_turns`);
- an HTTP error from the service (its injected errors, a restarting pod) is an `error`: the
  model reads `ERROR_MESSAGE`, likewise;
- a service that cannot be reached at all raises `ToolUnreachable`: the rollout fails, is
  counted as errored, and is never trained on (a broken setup is not the policy's doing).

At most `max_concurrent` calls of one client are in flight; the others wait their turn (the
wait is not the tool's latency and is not counted in it). Each call has its own connection:
a tool call's latency dwarfs a loopback connect, and no session outlives the loop it ran on.
"""

import asyncio
import time
import weakref
from dataclasses import dataclass
from typing import Literal

import aiohttp

TIMEOUT_MESSAGE = "error: the tool timed out"
ERROR_MESSAGE = "error: the tool failed"


class ToolUnreachable(RuntimeError):
    """The tool service did not accept the connection."""


@dataclass
class ToolCall:
    content: str
    outcome: Literal["ok", "timeout", "error"]
    latency_s: float


class ToolClient:
    def __init__(self, url: str, timeout_s: float, max_concurrent: int):
        if timeout_s <= 0 or max_concurrent < 1:
            raise ValueError(f"tool client: timeout_s ({timeout_s}) must be > 0 and max_concurrent ({max_concurrent}) >= 1")
        self.url, self.timeout_s, self.max_concurrent = url.rstrip("/"), timeout_s, max_concurrent
        self._limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()

    def _limit(self) -> asyncio.Semaphore:
        """The semaphore of the running loop."""
        loop = asyncio.get_running_loop()
        if loop not in self._limits:
            self._limits[loop] = asyncio.Semaphore(self.max_concurrent)
        return self._limits[loop]

    async def call(self, name: str, arguments: object) -> ToolCall:
        async with self._limit():
            started = time.monotonic()
            try:
                async with (asyncio.timeout(self.timeout_s), aiohttp.ClientSession() as session,
                            session.post(f"{self.url}/v1/tools/{name}", json=arguments) as response):
                    body = await response.json(content_type=None) if response.status < 500 else None
                    status = response.status
            except TimeoutError:
                return ToolCall(TIMEOUT_MESSAGE, "timeout", time.monotonic() - started)
            except aiohttp.ClientConnectorError as e:
                raise ToolUnreachable(f"tool service {self.url}: {e}") from e
            except aiohttp.ClientError:
                return ToolCall(ERROR_MESSAGE, "error", time.monotonic() - started)
            latency = time.monotonic() - started
        if status >= 400 or not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return ToolCall(ERROR_MESSAGE if status != 404 else f"error: no tool {name!r}", "error", latency)
        return ToolCall(body["content"], "ok", latency)
