"""ASGI middleware for vLLM's server: `/inference/v1/generate` as verifiers' training client reads it.

verifiers' training client (through `renderers` 0.1.12) and vLLM 0.32 disagree in two places;
this middleware, added with vLLM's own `--middleware` option (no patching of vLLM), fixes both:

- **Output mode.** The client calls the route without an `output_mode` and checks that each
  logprob entry names its token as `"token_id:N"`. vLLM answers such a request in `tokens` mode,
  whose logprob entries carry `token_id` but no `token`, so every rollout would fail with
  `MalformedGenerateResponseError`. In `text` mode with `--return-tokens-as-token-ids` (also set
  by rlkube inference) the entries are exactly what the client expects; token ids are the same in
  both modes. Requests that name an `output_mode` are left alone.
- **Routed experts** (`inference.return_routed_experts`, MoE models). vLLM returns a choice's
  routing as one string, a base64 `.npy` file of `[positions, layers, top_k]` expert ids
  from `sampling_params.routed_experts_prompt_start` on. The client expects an object `{"data":
  base64 of the raw array, "shape", "dtype", "start"}` and gives it to verifiers, which
  attributes the rows to the trace's tokens (`Branch.routed_experts`). Without the rewrite the
  client would fail on the string. Streamed answers pass through unchanged. On CPU, where vLLM
  cannot capture routing, rlkube's worker extension does (`CAPTURE_ROUTING_ENV` set): this
  middleware starts the capture when the engine is up and takes each answer's routing from the
  worker in vLLM's format before rewriting it (rlkube.inference.routing_capture).
"""

import base64
import io
import json
import os
import re

import numpy as np

from rlkube.inference.routing_capture import CAPTURE_ROUTING, TAKE_ROUTING

GENERATE_PATH = "/inference/v1/generate"
CAPTURE_ROUTING_ENV = "RLKUBE_CAPTURE_ROUTING"
_ROUTING_STRING = re.compile(rb'"routed_experts":\s*"')


class GenerateForRenderers:
    def __init__(self, app):
        self.app = app
        self.captures_routing = os.environ.get(CAPTURE_ROUTING_ENV) == "1"

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan" and self.captures_routing:
            await self.app(scope, receive, self._capturing_from_startup(scope, send))
            return
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
        start = routed_experts_start(body)
        body = with_text_mode(body)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        held, chunks = None, []

        async def rewrite(message):
            """Holds a JSON answer until its last byte, then sends it with its routing rewritten."""
            nonlocal held
            if message["type"] == "http.response.start" and not _is_stream(message):
                held = message
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            answer = b"".join(chunks)
            if self.captures_routing:
                answer = await with_captured_routing(answer, start, scope["app"].state.engine_client)
            answer = with_routed_experts_for_renderers(answer, start)
            await send(dict(held, headers=_with_length(held["headers"], len(answer))))
            await send({"type": "http.response.body", "body": answer, "more_body": False})

        await self.app(dict(scope, headers=_with_length(scope["headers"], len(body))), replay, rewrite)


    @staticmethod
    def _capturing_from_startup(scope, send):
        """`send` for the lifespan: the worker starts capturing once the engine is up, before
        the server takes a request."""

        async def start_capture_then_send(message):
            if message["type"] == "lifespan.startup.complete":
                await scope["app"].state.engine_client.collective_rpc(CAPTURE_ROUTING)
            await send(message)

        return start_capture_then_send


async def with_captured_routing(body: bytes, start: int, engine_client) -> bytes:
    """A one-choice answer with the routing the worker captured for it from position `start`
    on (vLLM's format)."""
    answer = _json_object(body)
    choices = (answer or {}).get("choices") or ()
    if len(choices) != 1 or choices[0].get("routed_experts") is not None or not answer.get("request_id"):
        return body
    routing = (await engine_client.collective_rpc(TAKE_ROUTING, args=(answer["request_id"], start)))[0]  # rank 0
    if routing is None:
        return body
    choices[0]["routed_experts"] = routing
    return json.dumps(answer).encode()


def _with_length(headers, length: int) -> list:
    return [*((k, v) for k, v in headers if k.lower() != b"content-length"), (b"content-length", str(length).encode())]


def _is_stream(start_message: dict) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in start_message["headers"])


def _json_object(body: bytes) -> dict | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def with_text_mode(body: bytes) -> bytes:
    """The request body with `output_mode: "text"` unless it names one (or is not a JSON object:
    vLLM answers that with its own validation error)."""
    request = _json_object(body)
    if request is None or "output_mode" in request:
        return body
    request["output_mode"] = "text"
    return json.dumps(request).encode()


def routed_experts_start(body: bytes) -> int:
    """The prompt position a request's routing starts at (`routed_experts_prompt_start`)."""
    sampling = (_json_object(body) or {}).get("sampling_params")
    start = sampling.get("routed_experts_prompt_start", 0) if isinstance(sampling, dict) else 0
    return start if isinstance(start, int) else 0


def with_routed_experts_for_renderers(body: bytes, start: int) -> bytes:
    """The answer with each choice's `.npy` routing string as the object the client reads; any
    other answer (no routing, an error) unchanged. Compact JSON with `data` first, so the
    client can splice the array out without decoding it as JSON."""
    if not _ROUTING_STRING.search(body):
        return body
    answer = json.loads(body)
    for choice in answer.get("choices") or ():
        encoded = choice.get("routed_experts")
        if isinstance(encoded, str):
            routing = np.load(io.BytesIO(base64.b64decode(encoded)), allow_pickle=False)
            choice["routed_experts"] = {
                "data": base64.b64encode(np.ascontiguousarray(routing).tobytes()).decode(),
                "shape": list(routing.shape),
                "dtype": str(routing.dtype),
                "start": start,
            }
    return json.dumps(answer, separators=(",", ":")).encode()
