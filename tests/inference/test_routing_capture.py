"""rlkube's capture of routed experts on CPU: each request's rows, step by step, as vLLM's V1
runner lays the batch out (requests in batch order, `num_scheduled_tokens` each), and what the
real server answers with it."""

import base64
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rlkube.inference.routing_capture import KEPT_FINISHED, RequestRouting

from tests.inference.test_server import (
    LONG_PROMPT_IDS,
    PROMPT_IDS,
    cached_when_sent_twice,
    generate,
)

LAYERS, TOP_K = 4, 2


class Capturer:
    """vLLM's capturer as the worker reads it: the last forward's rows, one per token."""

    def __init__(self):
        self.rows = torch.empty(0)

    def snapshot_routing_data(self, num_tokens: int) -> torch.Tensor:
        return self.rows[:num_tokens].to(torch.uint8)


def step(routing: RequestRouting, capturer: Capturer, batch: list[tuple[str, int, int]], finished=()):
    """One forward over `batch`: (request, position its chunk starts at, tokens); the row of a
    token at position p of request r is (r's index * 100 + p) in every layer and slot."""
    ids = {name: i for i, name in enumerate(sorted({name for name, _, _ in batch}))}
    rows = [np.full((2, 2), ids[name] * 100 + position) for name, start, count in batch
            for position in range(start, start + count)]
    capturer.rows = torch.tensor(np.array(rows)) if rows else torch.empty(0, 2, 2)
    runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=[name for name, _, _ in batch]),
        requests={name: SimpleNamespace(num_computed_tokens=start) for name, start, _ in batch},
    )
    scheduled = SimpleNamespace(
        total_num_scheduled_tokens=sum(count for _, _, count in batch),
        num_scheduled_tokens={name: count for name, _, count in batch},
        finished_req_ids=set(finished),
    )
    routing.after_step(runner, scheduled)


def positions(rows: np.ndarray) -> list[int]:
    return [int(row[0, 0]) % 100 for row in rows]


def test_each_request_gets_its_rows_in_position_order_across_prefill_chunks_and_decodes():
    capturer = Capturer()
    routing = RequestRouting(capturer)
    step(routing, capturer, [("a-1", 0, 3), ("b-2", 0, 4)])  # prefill, b's first chunk
    step(routing, capturer, [("b-2", 4, 2), ("a-1", 3, 1)])  # b's second chunk, a decodes
    step(routing, capturer, [("a-1", 4, 1), ("b-2", 6, 1)])
    a = routing.take("a")
    assert positions(a) == [0, 1, 2, 3, 4] and {int(v) // 100 for v in a[:, 0, 0]} == {0}
    b = routing.take("b")
    assert positions(b) == list(range(7)) and {int(v) // 100 for v in b[:, 0, 0]} == {1}
    assert routing.take("a") is None, "taken once"


def test_a_recomputed_request_overwrites_and_a_gap_makes_its_routing_unusable():
    capturer = Capturer()
    routing = RequestRouting(capturer)
    step(routing, capturer, [("a-1", 0, 4)])
    step(routing, capturer, [("a-1", 0, 5)])  # preempted, recomputed from the start
    assert positions(routing.take("a")) == [0, 1, 2, 3, 4]
    step(routing, capturer, [("c-3", 2, 3)])  # its first two positions were never computed here
    assert routing.take("c") is None


def test_routing_nobody_takes_is_dropped_after_enough_finished_requests():
    capturer = Capturer()
    routing = RequestRouting(capturer)
    step(routing, capturer, [("old-1", 0, 2)], finished={"old-1"})
    for i in range(KEPT_FINISHED):
        step(routing, capturer, [], finished={f"r{i}-x"})
    assert routing.take("old") is None


@pytest.mark.slow
async def test_the_server_returns_the_routing_transformers_computes(moe_inference_server):
    """The session's MoE engine (it returns routing): one row per forwarded position, each the
    top-k experts transformers' router picks at that position in every layer (near ties
    aside), and a later `routed_experts_prompt_start` gives the same rows from there on."""
    from transformers import AutoModelForCausalLM

    base_url = moe_inference_server.base_url
    full = (await generate(base_url, max_tokens=6))["choices"][0]
    routing = decoded(full["routed_experts"])
    tokens = PROMPT_IDS + full["token_ids"]
    assert routing.shape == (len(tokens) - 1, LAYERS, TOP_K)
    model = AutoModelForCausalLM.from_pretrained(moe_inference_server.model, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens[:-1]]), output_router_logits=True).router_logits
    expected = torch.stack([layer.topk(TOP_K).indices.sort(-1).values for layer in logits], dim=1).numpy()
    agree = (np.sort(routing, -1) == expected).all(-1).mean()
    assert agree >= 0.9, f"{agree:.3f} of token-layer pairs routed as transformers routes them"

    later = (await generate(base_url, max_tokens=6, routed_experts_prompt_start=5))["choices"][0]
    assert later["token_ids"] == full["token_ids"] and later["routed_experts"]["start"] == 5
    assert np.array_equal(decoded(later["routed_experts"]), routing[5:])


@pytest.mark.slow
async def test_a_prompt_sent_again_is_routed_again(moe_inference_server):
    """A prefix cache would serve a repeated prompt's positions without running the model, so
    the capture would have no rows for them: the engine that captures routing keeps none, and
    each answer carries the routing of every position."""
    base_url = moe_inference_server.base_url
    assert await cached_when_sent_twice(base_url, LONG_PROMPT_IDS) == 0
    first, again = [(await generate(base_url, LONG_PROMPT_IDS, max_tokens=2))["choices"][0] for _ in range(2)]
    assert decoded(first["routed_experts"]).shape == (len(LONG_PROMPT_IDS) + 1, LAYERS, TOP_K)
    assert np.array_equal(decoded(again["routed_experts"]), decoded(first["routed_experts"]))


def decoded(payload: dict) -> np.ndarray:
    """A choice's routing as verifiers decodes it."""
    data = np.frombuffer(base64.b64decode(payload["data"]), dtype=np.dtype(payload["dtype"]))
    return data.reshape(payload["shape"])
