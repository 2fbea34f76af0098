"""Run pods that answer the operator's `GET /status` as a hostile tenant's might, on a real
loopback socket: one server for many runs, each answered as its Service's name says.

- `trickle-…`: an answer one byte every `trickle_every` seconds, from the status line on (so no
  single socket read ever waits long), its body `trickle_bytes` long: for as long as the client
  stays (a day at a byte a second);
- `huge-…`: `huge_bytes` of JSON as fast as the socket takes them, chunked (no length told);
- anything else: a small status whose `step` is the whole seconds since the server started,
  so the age of the step a run's status shows is the age of that status.

The request line is read with the server's own code (asyncio streams), not a framework that
would buffer or time out on our behalf.
"""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit


@dataclass
class StatusPods:
    trickle_every: float = 1.0
    trickle_bytes: int = 100_000
    huge_bytes: int = 32 * 1024 * 1024
    url: str = ""
    """The operator's status URL template: `{service}` picks the behaviour."""
    started: float = field(default_factory=time.monotonic)
    hostile_seconds: dict[str, list[float]] = field(default_factory=lambda: {"trickle": [], "huge": []})
    """How long each hostile answer held its connection before the client gave up (or it ended)."""
    answered: int = 0
    """Healthy answers given."""
    holding: dict[asyncio.StreamWriter, tuple[str, float]] = field(default_factory=dict)
    """The hostile answers in progress: (kind, when it began)."""

    def step(self) -> int:
        return int(time.monotonic() - self.started)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        began, kind = time.monotonic(), ""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b" ", 2)[1].decode()
            service = parse_qs(urlsplit(target).query).get("service", [""])[0]
            kind = service.split("-", 1)[0]
            if kind in self.hostile_seconds:
                self.holding[writer] = (kind, began)
            if kind == "trickle":
                await self._trickle(reader, writer)
            elif kind == "huge":
                await self._huge(writer)
            else:
                body = json.dumps({"phase": "training", "step": self.step(), "reward": 0.5}).encode()
                writer.write(_head("Content-Length", len(body)) + body)
                await writer.drain()
                self.answered += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up
        finally:
            if self.holding.pop(writer, None) is not None:
                self.hostile_seconds[kind].append(time.monotonic() - began)
            writer.close()

    def held_longest(self) -> float:
        """Seconds the oldest hostile answer still in progress has been going (0: none is)."""
        return max((time.monotonic() - began for _, began in self.holding.values()), default=0.0)

    def close_all(self) -> None:
        """End every answer in progress (a client that never gives up would wait for ever)."""
        for writer in list(self.holding):
            writer.close()

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = json.dumps({"phase": "training", "step": 1, "reward": 0.5}).encode().ljust(self.trickle_bytes)
        for byte in _head("Content-Length", len(body)) + body:
            if reader.at_eof() or writer.is_closing():  # the client closed its side
                return
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(self.trickle_every)

    async def _huge(self, writer: asyncio.StreamWriter) -> None:
        writer.write(_head("Transfer-Encoding", "chunked"))
        chunk = b" " * 65536
        for _ in range(self.huge_bytes // len(chunk)):
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
        writer.write(b"1\r\n{\r\n0\r\n\r\n")  # never valid JSON: only its size matters
        await writer.drain()


def _head(header: str, value) -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{header}: {value}\r\n"
            "Connection: close\r\n\r\n").encode()


@contextlib.asynccontextmanager
async def serve_status_pods(**options) -> AsyncIterator[StatusPods]:
    pods = StatusPods(**options)
    server = await asyncio.start_server(pods.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pods.url = f"http://127.0.0.1:{port}/status?service={{service}}&namespace={{namespace}}&port={{port}}"
    async with server:
        try:
            yield pods
        finally:  # the answers in progress end at their next byte
            pods.close_all()
            for _ in range(int(pods.trickle_every / 0.05) + 20):
                if not pods.holding:
                    break
                await asyncio.sleep(0.05)
