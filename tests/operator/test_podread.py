"""Reads of a run's pods are bounded: a pod that trickles its answer, or answers with megabytes,
costs the operator at most the deadline and the byte cap, and says so (real sockets on loopback)."""

import asyncio
import time

import pytest
from aiohttp import web
from rlkube_operator import podread, progress

from tests.operator.hostile import serve_status_pods


def status_url(pods, service: str) -> str:
    return progress.status_url(pods.url, service=service, namespace="team-a", port=8080)


async def read(url: str) -> tuple[dict | podread.Unreadable, float]:
    """`progress.read_progress` as a reconcile worker calls it (a thread); (result, seconds).
    Bounded here too, so a read that never ends fails the test instead of hanging it."""
    started = time.monotonic()

    def call():
        try:
            return progress.read_progress(url)
        except podread.Unreadable as e:
            return e

    result = await asyncio.wait_for(asyncio.to_thread(call), 30)
    return result, time.monotonic() - started


async def test_a_trickled_answer_is_cut_at_the_deadline_and_the_connection_dropped():
    """A byte every 0.2 s, status line and headers included: no socket read ever waits long,
    so only a deadline over the whole read stops it."""
    async with serve_status_pods(trickle_every=0.2) as pods:
        url = status_url(pods, "trickle-orchestrator")
        error, seconds = await read(url)
        assert isinstance(error, podread.Unreadable), error
        assert error.reason == "ReadTimeout"
        assert str(error) == f"status read from {url} exceeded {podread.DEADLINE_S:g} s"
        assert seconds < podread.DEADLINE_S + 2  # the trickle alone would take 30 s
        await asyncio.sleep(0.5)  # the server notices the client gone at its next byte
        (held,) = pods.hostile_seconds["trickle"]
        assert held < podread.DEADLINE_S + 2


async def test_a_huge_answer_is_refused_past_the_byte_cap():
    async with serve_status_pods(huge_bytes=64 * 1024 * 1024) as pods:
        url = status_url(pods, "huge-orchestrator")
        error, seconds = await read(url)
        assert isinstance(error, podread.Unreadable) and error.reason == "ResponseTooLarge", error
        assert str(error) == f"status body from {url} over {podread.MAX_BYTES // 1024} KiB"
        assert seconds < podread.DEADLINE_S


async def test_a_healthy_answer_is_read():
    async with serve_status_pods() as pods:
        data, _ = await read(status_url(pods, "rt-orchestrator"))
        assert data["phase"] == "training" and data["step"] == pods.step()


class Answers(dict):
    base = ""


@pytest.fixture
async def answering():
    """A local GET /status answering with what `answers[path]` says: (HTTP code, headers, body)."""
    answers = Answers()

    async def handle(request):
        code, headers, body = answers[request.path]
        return web.Response(status=code, headers=headers, body=body)

    app = web.Application()
    app.router.add_get("/{path:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    answers.base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    yield answers
    await runner.cleanup()


@pytest.mark.parametrize(("answer", "reason", "says"), [
    ((503, {}, b"starting"), "HTTPError", "HTTP 503 Service Unavailable"),
    ((302, {"Location": "http://10.0.0.1/"}, b""), "HTTPError", "HTTP 302"),  # never followed
    ((200, {}, b"<html>"), "InvalidResponse", "is not JSON"),
    ((200, {}, b"[1, 2]"), "InvalidResponse", "is not a JSON object"),
    ((200, {"Content-Type": "application/json"}, b"{" + b" " * (podread.MAX_BYTES + 1) + b"}"),
     "ResponseTooLarge", "over 64 KiB"),
])
async def test_an_answer_that_is_no_status_says_why(answering, answer, reason, says):
    answering["/status"] = answer
    url = f"{answering.base}/status"
    error, _ = await read(url)
    assert isinstance(error, podread.Unreadable), error
    assert error.reason == reason and url in str(error) and says in str(error)


async def test_a_pod_that_is_not_there_is_unreachable():
    async with serve_status_pods() as pods:
        url = pods.url.split("/status")[0].rsplit(":", 1)[0] + ":1/status"  # nothing listens on port 1
    error, _ = await read(url)
    assert isinstance(error, podread.Unreadable) and error.reason == "Unreachable", error
    assert url in str(error)
