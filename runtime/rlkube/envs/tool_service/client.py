"""How an environment calls the tool service: bounded in time and in concurrency, recorded.

`ToolClient.call(name, arguments)` posts one call and returns a `ToolCall`: the text the
model reads and the call's outcome and latency. The rule for a call that does not answer:

- past `timeout_s` it is a `timeout`: the model reads `TIMEOUT_MESSAGE` and the episode goes
  on (the model may call again, within the agent's `max_turns`);
- an HTTP error from the service (its injected errors, a restarting pod) is an `error`: the
  model reads `ERROR_MESSAGE`, likewise;
- a service that cannot be reached at all raises `ToolUnreachable`: the rollout fails, is
  counted as errored, and is never trained on (a broken setup is not the policy's doing).

A call that did not reach a tool (the connection refused, reset or closed before an answer,
a connect that hangs, a gateway's 502/504: a tool pod that went away behind the Service) is
made again, up to `MAX_RETRIES` times with doubling backoff, all within the call's
`timeout_s`: another pod (or the restarted one) answers it, and `ToolCall.retries` counts the
tries it took. Only when the retries or the budget run out is it the outcome above (refused:
unreachable; reset: `error`; the budget: `timeout`). The service's own 503 (an injected error)
is an answer, never retried.

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
MAX_RETRIES = 8
"""Tries of a call after its first that reached no tool: with `BACKOFF_S` doubling up to
`MAX_BACKOFF_S`, ~4.5 s of waits, time for a Service to route around a deleted pod."""
BACKOFF_S, MAX_BACKOFF_S = 0.05, 1.0
CONNECT_TIMEOUT_S = 1.0
"""A connect that has not completed by then is retried (a pod IP that went away drops packets)."""
GATEWAY_STATUSES = frozenset({502, 504})
"""Statuses a proxy answers for a backend that went away: retried, never the tool's answer."""


class ToolUnreachable(RuntimeError):
    """The tool service did not accept the connection."""


@dataclass
class ToolCall:
    content: str
    outcome: Literal["ok", "timeout", "error"]
    latency_s: float
    retries: int = 0
    """Tries made again because the call reached no tool (a pod that went away)."""


class _NoTool(Exception):
    """One try reached no tool; `unreachable` when nothing accepted the connection."""

    def __init__(self, reason: str, unreachable: bool):
        super().__init__(reason)
        self.unreachable = unreachable


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
            retries, missed = 0, None
            try:
                async with asyncio.timeout(self.timeout_s):
                    while True:
                        missed = None  # a budget that ends in this try: its timeout, not an earlier miss
                        try:
                            status, body = await self._post(name, arguments)
                            break
                        except _NoTool as e:
                            missed = e
                            if retries == MAX_RETRIES:
                                break
                            await asyncio.sleep(min(BACKOFF_S * 2**retries, MAX_BACKOFF_S))
                            retries += 1
            except TimeoutError:
                if missed is None or not missed.unreachable:
                    return ToolCall(TIMEOUT_MESSAGE, "timeout", time.monotonic() - started, retries)
            except aiohttp.ClientError:
                return ToolCall(ERROR_MESSAGE, "error", time.monotonic() - started, retries)
            latency = time.monotonic() - started
        if missed is not None:  # the retries or the budget ran out without reaching a tool
            if missed.unreachable:
                raise ToolUnreachable(f"tool service {self.url}: {missed} (after {retries} retries)") from missed
            return ToolCall(ERROR_MESSAGE, "error", latency, retries)
        if status >= 400 or not isinstance(body, dict) or not isinstance(body.get("content"), str):
            return ToolCall(ERROR_MESSAGE if status != 404 else f"error: no tool {name!r}", "error", latency, retries)
        return ToolCall(body["content"], "ok", latency, retries)

    async def _post(self, name: str, arguments: object) -> tuple[int, object]:
        """One try: the status and JSON body, or `_NoTool` when it reached no tool."""
        try:
            async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(sock_connect=CONNECT_TIMEOUT_S)) as session,
                        session.post(f"{self.url}/v1/tools/{name}", json=arguments) as response):
                if response.status in GATEWAY_STATUSES:
                    raise _NoTool(f"HTTP {response.status}", unreachable=False)
                return response.status, await response.json(content_type=None) if response.status < 500 else None
        except aiohttp.ServerTimeoutError as e:  # a TimeoutError too: caught before the budget's
            raise _NoTool(f"connect timed out: {e}", unreachable=True) from e
        except aiohttp.ClientConnectorError as e:
            raise _NoTool(str(e), unreachable=True) from e
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, aiohttp.ClientPayloadError) as e:
            raise _NoTool(f"connection lost: {e!r}", unreachable=False) from e
