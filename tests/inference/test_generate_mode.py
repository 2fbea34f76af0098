"""The middleware that makes vLLM's token-in/token-out route answer verifiers' training client."""

import asyncio
import binascii
import json

import numpy as np
import pytest
from fastapi.responses import JSONResponse
from renderers.client import parse_generate_response
from rlkube.inference.generate_mode import (
    GENERATE_PATH,
    GenerateForRenderers,
    routed_experts_start,
    with_text_mode,
)
from vllm.entrypoints.openai.chat_completion.protocol import (
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
)
from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
    GenerateLogProbs,
    GenerateLogProbsContent,
    GenerateRequest,
    GenerateTextChoice,
    GenerateTextResponse,
    GenerateTextStreamChoice,
    GenerateTextStreamResponse,
    GenerateTokensChoice,
    GenerateTokensResponse,
)
from vllm.utils.serial_utils import numpy2base64


def test_text_mode_is_the_default_only():
    assert json.loads(with_text_mode(b'{"token_ids": [1]}')) == {"token_ids": [1], "output_mode": "text"}
    assert with_text_mode(b'{"output_mode": "tokens"}') == b'{"output_mode": "tokens"}'
    assert with_text_mode(b"not json") == b"not json"
    assert with_text_mode(b"[1, 2]") == b"[1, 2]"


COMPLETION, LOGPROBS = [5, 6], [-0.5, -1.25]


def vllm_answer(request: bytes, routing: np.ndarray | None = None) -> bytes:
    """What vLLM 0.32's `/inference/v1/generate` answers `request` (validated as vLLM validates
    it), from vLLM's own protocol classes, serialized as its route serializes them: in `text` mode
    each logprob names its token (`token_id:N`, with `--return-tokens-as-token-ids` as rlkube starts
    vLLM), in `tokens` mode only its id; a stream as one SSE chunk; the routing as a `.npy` string."""
    parsed = GenerateRequest.model_validate_json(request)
    fields = {"index": 0, "token_ids": COMPLETION, "routed_experts": None if routing is None else numpy2base64(routing)}
    if parsed.output_mode == "text":
        content = [ChatCompletionLogProbsContent(token=f"token_id:{t}", logprob=lp) for t, lp in zip(COMPLETION, LOGPROBS)]
        logprobs = ChatCompletionLogProbs(content=content)
        choice, answer = (GenerateTextStreamChoice, GenerateTextStreamResponse) if parsed.stream else (
            GenerateTextChoice, GenerateTextResponse)
        answer = answer(request_id="r", choices=[choice(text="ab", logprobs=logprobs, **fields)])
    else:
        logprobs = GenerateLogProbs(content=[GenerateLogProbsContent(token_id=t, logprob=lp)
                                             for t, lp in zip(COMPLETION, LOGPROBS)])
        answer = GenerateTokensResponse(request_id="r", choices=[GenerateTokensChoice(logprobs=logprobs, **fields)])
    if parsed.stream:
        return f"data: {answer.model_dump_json()}\n\ndata: [DONE]\n\n".encode()
    return JSONResponse(content=answer.model_dump()).body


def run(path: str, chunks: list[bytes], answer=vllm_answer):
    """Push a request through the middleware into an app that records what it received and
    answers `answer(request body)` in two chunks (a stream for `stream` requests); returns
    (request body, request headers, response body, response headers)."""
    seen, sent = {}, []

    async def app(scope, receive, send):
        body, more = b"", True
        while more:
            message = await receive()
            body += message["body"]
            more = message["more_body"]
        seen.update(body=body, headers=dict(scope["headers"]))
        response = answer(body)
        stream = json.loads(body).get("stream")
        content_type = b"text/event-stream" if stream else b"application/json"
        headers = [(b"content-type", content_type), (b"content-length", str(len(response)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        half = len(response) // 2
        await send({"type": "http.response.body", "body": response[:half], "more_body": True})
        await send({"type": "http.response.body", "body": response[half:], "more_body": False})

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": [(b"content-length", b"99")]}
    asyncio.run(GenerateForRenderers(app)(scope, receive, send))
    response = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return seen["body"], seen["headers"], response, dict(sent[0]["headers"])


# What verifiers' training client sends: no `output_mode`.
CLIENT_REQUEST = {"token_ids": [1] * 8, "sampling_params": {"logprobs": 1, "skip_special_tokens": False}}


def test_the_client_gets_logprobs_that_name_their_tokens():
    """vLLM answers a request without `output_mode` in `tokens` mode, whose logprobs the client
    refuses; the middleware asks for `text` mode, where each entry is `token_id:N`."""
    request = json.dumps(CLIENT_REQUEST).encode()
    body, headers, response, _ = run(GENERATE_PATH, [request[:10], request[10:]])
    assert headers[b"content-length"] == str(len(body)).encode()
    choice = parse_generate_response(response)["choices"][0]
    assert [e["token"] for e in choice["logprobs"]["content"]] == [f"token_id:{t}" for t in COMPLETION]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == LOGPROBS and choice["token_ids"] == COMPLETION


def test_other_routes_pass_through_untouched():
    """The middleware answers only `/inference/v1/generate`; a chat completion is not its business."""
    body, headers, response, _ = run("/v1/chat/completions", [b'{"a": 1}'], answer=lambda _: b'{"routed_experts": "x"}')
    assert body == b'{"a": 1}' and headers[b"content-length"] == b"99"
    assert response == b'{"routed_experts": "x"}'


def test_routed_experts_reach_the_client_as_the_array_vllm_computed():
    routing = np.random.default_rng(0).integers(0, 4, size=(9, 2, 2)).astype(np.uint8)
    sampling = CLIENT_REQUEST["sampling_params"] | {"routed_experts_prompt_start": 3}
    request = json.dumps(CLIENT_REQUEST | {"sampling_params": sampling}).encode()
    body, _, response, headers = run(GENERATE_PATH, [request], answer=lambda body: vllm_answer(body, routing))
    assert headers[b"content-length"] == str(len(response)).encode()
    # Decoded as verifiers' client decodes it (renderers' parser, then verifiers' attribution).
    answer = parse_generate_response(response)
    payload = answer["choices"][0].pop("routed_experts")
    decoded = np.frombuffer(binascii.a2b_base64(payload["data"]), dtype=np.dtype(payload["dtype"]))
    assert np.array_equal(decoded.reshape(payload["shape"]), routing)
    assert payload["start"] == 3
    # The rest is vLLM's answer as it was.
    unchanged = json.loads(vllm_answer(body, routing))
    del unchanged["choices"][0]["routed_experts"]
    assert answer == unchanged


@pytest.mark.parametrize("stream", [False, True])
def test_answers_without_routing_and_streams_are_vllm_s(stream):
    """Only a whole answer's routing string is rewritten: an answer without routing, or a stream
    (vLLM's SSE chunks, routing included), reaches the client as vLLM sent it, in text mode."""
    routing = np.zeros((9, 2, 2), dtype=np.uint8) if stream else None
    request = json.dumps(CLIENT_REQUEST | {"stream": stream}).encode()
    body, _, response, _ = run(GENERATE_PATH, [request], answer=lambda body: vllm_answer(body, routing))
    assert response == vllm_answer(body, routing)
    assert b'"output_mode":"text"' in response


def test_routing_start_defaults_to_the_first_position():
    assert routed_experts_start(b'{"sampling_params": {"routed_experts_prompt_start": 7}}') == 7
    assert routed_experts_start(b'{"sampling_params": {}}') == 0
    assert routed_experts_start(b"not json") == 0


