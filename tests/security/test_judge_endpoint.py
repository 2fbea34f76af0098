"""The judge's loopback endpoint forwards the judge's generation routes alone.

Any program an environment starts can call the endpoint, which adds the run's credential to
what it forwards: a path that reached the judge's other routes (`/collective_rpc`, `/pause`)
would let that program load weights of its choosing into the judge, sending the credential to
an address it picks. Each case sends the raw request line over the socket (HTTP clients
normalise `..` themselves) to the real endpoint, in front of a judge that records every
request it receives."""

import asyncio
import json

import pytest
from aiohttp import web
from rlkube.config import JudgeConfig
from rlkube.orchestrator.judge import JudgeEndpoint

from tests.orchestrator.fake_inference import FakeInferenceThread


class RecordingJudge:
    """Answers every path and method with 200, and records (method, path) of each request."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.any)
        return app

    async def any(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path))
        return web.json_response({"object": "list", "data": []})


async def raw_request(port: int, method: str, target: str) -> int:
    """The status of `method target` sent verbatim (no client-side normalisation)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = b"{}"
    writer.write(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
    await writer.drain()
    status_line = await reader.readline()
    writer.close()
    return int(status_line.split()[1])


def statuses(requests: list[tuple[str, str]]) -> tuple[list[int], list[tuple[str, str]]]:
    judge = RecordingJudge()
    with FakeInferenceThread(judge) as server:
        async def send():
            async with JudgeEndpoint(JudgeConfig(model="j", base_urls=[server.url], wait_s=1)) as endpoint:
                return [await raw_request(endpoint.port, m, t) for m, t in requests]

        return asyncio.run(send()), judge.seen


ESCAPES = [
    "/v1/../collective_rpc",
    "/v1/%2e%2e/collective_rpc",
    "/v1/%2E%2E/pause",
    "/v1/%252e%252e/collective_rpc",
    "/v1/..%2fcollective_rpc",
    "/v1/chat/../../collective_rpc",
    "/collective_rpc",
    "/pause",
    "/rlkube/load_lora_adapter",
    "/v1/load_lora_adapter",
    "/init_weight_transfer_engine",
]


@pytest.mark.parametrize("target", ESCAPES)
def test_paths_outside_the_generation_routes_never_reach_the_judge(target):
    got, seen = statuses([("POST", target)])
    assert got == [404] and seen == [], f"{target} reached the judge as {seen}"


def test_generation_routes_reach_the_judge_at_their_own_path():
    got, seen = statuses([("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
                          ("POST", "/v1/./chat//completions"), ("POST", "/v1/%63hat/completions?x=1")])
    assert got == [200] * 5
    assert seen == [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
                    ("POST", "/v1/chat/completions"), ("POST", "/v1/chat/completions")]


@pytest.mark.parametrize(("method", "target"), [("DELETE", "/v1/models"), ("GET", "/v1/chat/completions"),
                                                ("PUT", "/v1/completions")])
def test_another_method_on_a_generation_route_is_refused(method, target):
    got, seen = statuses([(method, target)])
    assert got == [405] and seen == []


def test_the_refusal_names_what_is_forwarded():
    judge = RecordingJudge()
    with FakeInferenceThread(judge) as server:
        async def send():
            import aiohttp

            async with (JudgeEndpoint(JudgeConfig(model="j", base_urls=[server.url])) as endpoint,
                        aiohttp.ClientSession() as s, s.post(f"http://127.0.0.1:{endpoint.port}/pause") as r):
                return r.status, json.loads(await r.read())

        status, body = asyncio.run(send())
    assert status == 404 and "/v1/chat/completions" in body["error"]["message"]
