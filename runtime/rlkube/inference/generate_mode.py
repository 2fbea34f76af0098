"""ASGI middleware for vLLM's server: token-in/token-out requests default to `output_mode="text"`.

verifiers' training client (through `renderers` 0.1.12) calls `/inference/v1/generate` without an
`output_mode` and checks that each logprob entry names its token as `"token_id:N"`. vLLM 0.32
answers such a request in `tokens` mode, whose logprob entries carry `token_id` but no `token`,
so every rollout fails with `MalformedGenerateResponseError`. In `text` mode with
`--return-tokens-as-token-ids` (also set by rlkube inference) the entries are exactly what the
client expects; token ids are the same in both modes. Requests that name an `output_mode` are
left alone. Added to vLLM with its own `--middleware` option (no patching of vLLM).
"""

import json

GENERATE_PATH = "/inference/v1/generate"


class GenerateTextMode:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != GENERATE_PATH:
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # client went away: nobody to answer
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        body = with_text_mode(body)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        scope = dict(scope, headers=[*headers, (b"content-length", str(len(body)).encode())])
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def with_text_mode(body: bytes) -> bytes:
    """The request body with `output_mode: "text"` unless it names one (or is not a JSON object:
    vLLM answers that with its own validation error)."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    if not isinstance(request, dict) or "output_mode" in request:
        return body
    request["output_mode"] = "text"
    return json.dumps(request).encode()
