"""Every HTTP read the operator makes of a run's pods, bounded in time and in bytes.

A run's pods run the tenant's image. A per-read socket timeout alone lets a pod that trickles
its answer a byte a second hold the reconcile worker reading it for as long as it likes (a
worker pool of a few threads serves every run), and a pod answering gigabytes fills the
operator's memory. So a read has one wall-clock deadline over connect, status line, headers
and body, and stops past `max_bytes`; either way it fails with a message that says why.

The deadline is `asyncio.timeout` over the whole request, in a private event loop of the
calling worker thread: it cancels whatever is being awaited, a header trickled byte by byte
included. aiohttp rather than httpx: a client cannot be shared between the workers' loops, and
a new httpx client builds an SSL context (about 20 ms), an aiohttp session next to nothing.
"""

import asyncio
import json

import aiohttp

DEADLINE_S = 2.0
MAX_BYTES = 64 * 1024


class Unreadable(Exception):
    """A pod's answer that could not be read; `reason` is CamelCase, for a condition."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def get_json(url: str, what: str, *, deadline_s: float = DEADLINE_S, max_bytes: int = MAX_BYTES) -> dict:
    """GET `url` (`what` names it in errors: "status") and return its JSON object, within
    `deadline_s` seconds in all and `max_bytes` of body; raises `Unreadable`. Blocking: call it
    from a worker thread, never from an event loop."""
    loop = asyncio.new_event_loop()
    try:
        body = loop.run_until_complete(_get(url, what, deadline_s, max_bytes))
    finally:
        loop.close()  # without waiting for a name lookup still running in the loop's executor
    try:
        data = json.loads(body)
    except ValueError as e:
        raise Unreadable("InvalidResponse", f"{what} from {url} is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise Unreadable("InvalidResponse", f"{what} from {url} is not a JSON object")
    return data


async def _get(url: str, what: str, deadline_s: float, max_bytes: int) -> bytes:
    too_large = Unreadable("ResponseTooLarge", f"{what} body from {url} over {max_bytes // 1024} KiB")
    try:
        async with asyncio.timeout(deadline_s), aiohttp.ClientSession() as session, \
                session.get(url, allow_redirects=False) as response:
            if response.status != 200:
                raise Unreadable("HTTPError", f"{what} from {url}: HTTP {response.status} {response.reason}")
            if (response.content_length or 0) > max_bytes:
                raise too_large
            body = bytearray()
            async for chunk in response.content.iter_any():
                body += chunk
                if len(body) > max_bytes:
                    raise too_large
            return bytes(body)
    except TimeoutError:
        raise Unreadable("ReadTimeout", f"{what} read from {url} exceeded {deadline_s:g} s") from None
    except (aiohttp.ClientError, OSError) as e:
        raise Unreadable("Unreachable", f"{what} from {url}: {type(e).__name__}: {e}") from None
