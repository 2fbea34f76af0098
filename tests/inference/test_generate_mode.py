"""The middleware that makes vLLM's token-in/token-out route answer verifiers' training client."""

import asyncio
import base64
import binascii
import json

import numpy as np
from renderers.client import parse_generate_response
from rlkube.inference.generate_mode import (
    GENERATE_PATH,
    GenerateForRenderers,
    routed_experts_start,
    with_text_mode,
)
from vllm.utils.serial_utils import numpy2base64


def test_text_mode_is_the_default_only():
    assert json.loads(with_text_mode(b'{"token_ids": [1]}')) == {"token_ids": [1], "output_mode": "text"}
    assert with_text_mode(b'{"output_mode": "tokens"}') == b'{"output_mode": "tokens"}'
    assert with_text_mode(b"not json") == b"not json"
    assert with_text_mode(b"[1, 2]") == b"[1, 2]"


def run(path: str, chunks: list[bytes], answer: bytes = b"{}", content_type: bytes = b"application/json"):
    """Push a request through the middleware into an app that records what it received and
    answers `answer` in two chunks; returns (request body, request headers, response body,
    response headers)."""
    seen, sent = {}, []

    async def app(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message["body"]
            more = message["more_body"]
        seen.update(body=body, headers=dict(scope["headers"]))
        headers = [(b"content-type", content_type), (b"content-length", str(len(answer)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = len(answer) // 2
        await send({"type": "http.response.body", "body": answer[:half], "more_body": True})
        await send({"type": "http.response.body", "body": answer[half:], "more_body": False})

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"99")]}
    asyncio.run(GenerateForRenderers(app)(scope, receive, send))
    response = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return seen["body"], seen["headers"], response, dict(sent[0]["headers"])


def test_generate_requests_are_rewritten_with_a_matching_length():
    body, headers, _, _ = run(GENERATE_PATH, [b'{"token_ids": ', b"[1, 2]}"])
    assert json.loads(body)["output_mode"] == "text"
    assert headers[b"content-length"] == str(len(body)).encode()


def test_other_routes_pass_through_untouched():
    body, headers, response, _ = run("/v1/chat/completions", [b'{"a": 1}'], answer=b'{"routed_experts": "x"}')
    assert body == b'{"a": 1}' and headers[b"content-length"] == b"99"
    assert response == b'{"routed_experts": "x"}'


def vllm_answer(routing: np.ndarray | None) -> bytes:
    """A generate answer as vLLM 0.32 serializes it: the routing as a base64 `.npy` string."""
    choice = {"index": 0, "token_ids": [5, 6], "routed_experts": None if routing is None else numpy2base64(routing)}
    return json.dumps({"request_id": "r", "choices": [choice]}).encode()


def test_routed_experts_reach_the_client_as_the_array_vllm_computed():
    routing = np.random.default_rng(0).integers(0, 4, size=(9, 2, 2)).astype(np.uint8)
    request = json.dumps({"token_ids": [1] * 8, "sampling_params": {"routed_experts_prompt_start": 3}}).encode()
    _, _, response, headers = run(GENERATE_PATH, [request], answer=vllm_answer(routing))
    assert headers[b"content-length"] == str(len(response)).encode()
    # Decoded as verifiers' client decodes it (renderers' parser, then verifiers' attribution).
    payload = parse_generate_response(response)["choices"][0]["routed_experts"]
    decoded = np.frombuffer(binascii.a2b_base64(payload["data"]), dtype=np.dtype(payload["dtype"]))
    assert np.array_equal(decoded.reshape(payload["shape"]), routing)
    assert payload["start"] == 3


def test_answers_without_routing_and_streams_pass_through():
    plain = vllm_answer(None)
    assert run(GENERATE_PATH, [b"{}"], answer=plain)[2] == plain
    stream = b'data: {"routed_experts": "' + base64.b64encode(b"x") + b'"}\n\n'
    assert run(GENERATE_PATH, [b"{}"], answer=stream, content_type=b"text/event-stream")[2] == stream


def test_routing_start_defaults_to_the_first_position():
    assert routed_experts_start(b'{"sampling_params": {"routed_experts_prompt_start": 7}}') == 7
    assert routed_experts_start(b'{"sampling_params": {}}') == 0
    assert routed_experts_start(b"not json") == 0


