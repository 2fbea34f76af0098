"""The middleware that makes vLLM's token-in/token-out route answer verifiers' training client."""

import asyncio
import json

from rlkube.inference.generate_mode import GENERATE_PATH, GenerateTextMode, with_text_mode


def test_text_mode_is_the_default_only():
    assert json.loads(with_text_mode(b'{"token_ids": [1]}')) == {"token_ids": [1], "output_mode": "text"}
    assert with_text_mode(b'{"output_mode": "tokens"}') == b'{"output_mode": "tokens"}'
    assert with_text_mode(b"not json") == b"not json"
    assert with_text_mode(b"[1, 2]") == b"[1, 2]"


def run(path: str, chunks: list[bytes]) -> tuple[bytes, dict]:
    """Push a request through the middleware into an app that records what it received."""
    seen = {}

    async def app(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message["body"]
            more = message["more_body"]
        seen.update(body=body, headers=dict(scope["headers"]))

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"99")]}
    asyncio.run(GenerateTextMode(app)(scope, receive, None))
    return seen["body"], seen["headers"]


def test_generate_requests_are_rewritten_with_a_matching_length():
    body, headers = run(GENERATE_PATH, [b'{"token_ids": ', b"[1, 2]}"])
    assert json.loads(body)["output_mode"] == "text"
    assert headers[b"content-length"] == str(len(body)).encode()


def test_other_routes_pass_through_untouched():
    body, headers = run("/v1/chat/completions", [b'{"a": 1}'])
    assert body == b'{"a": 1}' and headers[b"content-length"] == b"99"
