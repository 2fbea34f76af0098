"""The long-tail tool service and the tool-chain environment: the latency distribution from its
seed, real waits over HTTP, the client's timeout and concurrency bounds, and multi-turn
rollouts that call the service (the timeout rule's reward, errored rollouts never trained)."""

import asyncio
import contextlib
import json
import re
import threading
import time
import urllib.request

import pytest
from rlkube.config import ClientConfig, EnvConfig, SamplingConfig
from rlkube.envs import load_env
from rlkube.envs.tool_chain import CHAIN_CREDIT, reward, sft_examples, solved_exchange
from rlkube.envs.tool_service.client import (
    ERROR_MESSAGE,
    TIMEOUT_MESSAGE,
    ToolClient,
    ToolUnreachable,
)
from rlkube.envs.tool_service.latency import LatencyModel, ToolServiceConfig
from rlkube.envs.tool_service.server import serve
from rlkube.envs.tool_service.tools import chain, lookup, next_key, value_of
from rlkube.histogram import Histogram
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.rollouts import EnvRunner

from tests.fixtures.inference import free_port
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

TOOL_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)


@pytest.mark.parametrize(("p50", "ratio"), [(0.2, 20.0), (0.05, 5.0), (1.0, 50.0)])
def test_latency_has_the_configured_median_and_tail_from_its_seed(p50, ratio):
    model = LatencyModel(ToolServiceConfig(p50_s=p50, tail_ratio=ratio, seed=7))
    draws = sorted(model.draw()[0] for _ in range(40_000))
    assert draws[len(draws) // 2] == pytest.approx(p50, rel=0.03)
    assert draws[int(0.99 * len(draws))] / p50 == pytest.approx(ratio, rel=0.12)
    again = LatencyModel(ToolServiceConfig(p50_s=p50, tail_ratio=ratio, seed=7))
    other = LatencyModel(ToolServiceConfig(p50_s=p50, tail_ratio=ratio, seed=8))
    assert [again.draw() for _ in range(5)] != [other.draw() for _ in range(5)]
    replay = LatencyModel(ToolServiceConfig(p50_s=p50, tail_ratio=ratio, seed=7))
    assert sorted(replay.draw()[0] for _ in range(40_000)) == draws, 'the same seed, the same latencies'


def test_tail_ratio_one_is_a_constant_latency_and_rates_draw_outcomes():
    model = LatencyModel(ToolServiceConfig(p50_s=0.3, tail_ratio=1.0, timeout_rate=0.1, error_rate=0.2, hang_s=9.0))
    draws = [model.draw() for _ in range(10_000)]
    assert {w for w, outcome in draws if outcome != "hang"} == {0.3}
    shares = {o: sum(outcome == o for _, outcome in draws) / len(draws) for o in ("ok", "hang", "error")}
    assert shares == pytest.approx({"ok": 0.7, "hang": 0.1, "error": 0.2}, abs=0.02)
    with pytest.raises(ValueError, match="timeout_rate .* error_rate"):
        LatencyModel(ToolServiceConfig(timeout_rate=0.6, error_rate=0.5))


def test_the_chain_tool_leads_from_a_key_to_a_value():
    keys = chain("bqxkz")
    assert [len(k) for k in keys] == [5, 4, 3] and keys[1] == next_key("bqxkz")
    assert [lookup({"key": k}) for k in keys] == [*keys[1:], value_of(keys[-1])]
    assert lookup({"key": keys[-1]}).isdigit()


@pytest.mark.parametrize(
    ("answer", "looked_up", "expected"),
    [("VALUE", [], 1.0), ("000", "ALL", CHAIN_CREDIT), ("000", "FIRST", CHAIN_CREDIT / 3), ("000", [], 0.0)],
)
def test_reward_is_the_value_with_credit_for_the_keys_looked_up(answer, looked_up, expected):
    keys = chain("bqxkz")
    answer = value_of(keys[-1]) if answer == "VALUE" else answer
    looked_up = keys if looked_up == "ALL" else keys[:1] if looked_up == "FIRST" else looked_up
    assert value_of(keys[-1]) != "000"
    assert reward(answer, "bqxkz", looked_up) == pytest.approx(expected)


def test_sft_rows_solve_the_chain_and_some_retry_a_timed_out_call():
    rows = sft_examples(num_examples=20, retry_every=10)
    tool_messages = [[m["content"] for m in row["messages"] if m["role"] == "tool"] for row in rows]
    assert sum(TIMEOUT_MESSAGE in contents for contents in tool_messages) == 2
    key = rows[1]["messages"][0]["content"]
    assert rows[1]["messages"] == solved_exchange(key)
    assert tool_messages[1] == [*chain(key)[1:], value_of(chain(key)[-1])]
    assert rows[1]["messages"][-1] == {"role": "assistant", "content": value_of(chain(key)[-1])}


class ToolService:
    """`serve` on its own loop in a thread, as the separate process it is in a run."""

    def __init__(self, port: int | None = None, **config):
        self.config = ToolServiceConfig(port=port or free_port(), **config)
        self.url = f"http://127.0.0.1:{self.config.port}"
        self.loop = asyncio.new_event_loop()

    def __enter__(self):
        started = threading.Event()

        async def run():
            self.task = asyncio.current_task()
            ready = asyncio.Event()
            waiter = asyncio.ensure_future(ready.wait())
            waiter.add_done_callback(lambda _: started.set())
            with contextlib.suppress(asyncio.CancelledError):
                await serve(self.config, ready)

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(run()), daemon=True)
        self.thread.start()
        assert started.wait(10)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.task.cancel)
        self.thread.join(10)


def test_calls_wait_their_latency_in_wall_time_and_are_bounded():
    async def calls(url, n, **client):
        tools = ToolClient(url, **client)
        started = time.monotonic()
        results = await asyncio.gather(*(tools.call("lookup", {"key": "abcd"}) for _ in range(n)))
        return results, time.monotonic() - started

    with ToolService(p50_s=0.2, tail_ratio=1.0) as service:
        # 6 calls of 0.2 s, 2 at a time: three rounds, each call's own latency ~0.2 s (not its wait)
        results, wall = asyncio.run(calls(service.url, 6, timeout_s=5.0, max_concurrent=2))
        assert [r.content for r in results] == [next_key("abcd")] * 6 and {r.outcome for r in results} == {"ok"}
        assert wall >= 0.6 and all(0.19 <= r.latency_s < 0.6 for r in results)
    with ToolService(p50_s=0.01, timeout_rate=1.0) as service:
        (result,), wall = asyncio.run(calls(service.url, 1, timeout_s=0.3, max_concurrent=4))
        assert (result.content, result.outcome) == (TIMEOUT_MESSAGE, "timeout") and 0.3 <= wall < 2
    with ToolService(p50_s=0.01, error_rate=1.0) as service:
        (result,), _ = asyncio.run(calls(service.url, 1, timeout_s=5.0, max_concurrent=4))
        assert (result.content, result.outcome) == (ERROR_MESSAGE, "error")
    with pytest.raises(ToolUnreachable, match="tool service"):
        asyncio.run(calls(f"http://127.0.0.1:{free_port()}", 1, timeout_s=5.0, max_concurrent=1))


class RestartedOnFirstCall:
    """A tool service stopped while its first call is in flight (its connections closed, as a
    deleted pod's are) and started again on the same port `down_s` later."""

    def __init__(self, down_s: float, **config):
        self.service, self.down_s = ToolService(**config), down_s
        self.url, self.restarts = self.service.url, 0

    def _watch(self):
        while not self.done.is_set():
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/stats", timeout=1) as stats:
                if sum(json.load(stats).values()) and not self.restarts:
                    time.sleep(0.05)  # the call is in its latency's sleep
                    self.service.__exit__()
                    time.sleep(self.down_s)
                    self.service = ToolService(self.service.config.port, **self.service.config.model_dump(exclude={"port"})).__enter__()
                    self.restarts += 1
            time.sleep(0.02)

    def __enter__(self):
        self.service.__enter__()
        self.done = threading.Event()
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.watcher.join(10)
        self.service.__exit__()


def test_a_call_cut_by_a_restarting_service_is_retried_within_its_budget():
    """A call in flight when its service goes away (the connection closed) and made while it is
    down (refused) is tried again until the service answers: an `ok`, its retries counted."""
    with RestartedOnFirstCall(down_s=0.4, p50_s=0.3, tail_ratio=1.0) as service:
        result = asyncio.run(ToolClient(service.url, timeout_s=8.0, max_concurrent=1).call("lookup", {"key": "abcd"}))
        assert service.restarts == 1
    assert (result.content, result.outcome) == (next_key("abcd"), "ok")
    assert result.retries >= 2, "cut once, refused at least once while down"
    with RestartedOnFirstCall(down_s=3.0, p50_s=0.3, tail_ratio=1.0) as service, \
            pytest.raises(ToolUnreachable, match=r"after [1-9]\d* retries"):  # past its budget, refused: unreachable
        asyncio.run(ToolClient(service.url, timeout_s=1.0, max_concurrent=1).call("lookup", {"key": "abcd"}))


class ChainModel:
    """A fake engine policy that solves the chain: it calls `lookup` on the newest key it read
    (the user's, then each tool result's), calls again after a timeout, answers a value."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, prompt_ids: list[int]) -> list[int]:
        prompt = self.tokenizer.decode(prompt_ids)
        results = TOOL_RESPONSE.findall(prompt)
        keys = [r for r in results if r.isalpha()]
        if results and results[-1].isdigit():
            text = results[-1]
        else:
            key = keys[-1] if keys else re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt)[-1]
            text = f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'
        return self.tokenizer.encode(text, add_special_tokens=False)


def chain_rollout(model_dir, service_url: str, **args):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    env_config = EnvConfig(id="tool_chain", args={"num_examples": 4, "tool_url": service_url, **args})
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    assert runner.rollout_path == "lean"

    async def go(url):
        pool = InferencePool(ClientConfig(base_urls=[url]), str(model_dir), str(model_dir), SamplingConfig(max_tokens=96))
        async with runner.serving():
            example_id, task = runner.next_task()
            return task, await runner.rollout(task, example_id, pool.context_at(pool.base_urls[0]), 1.0, lambda: 0)

    with FakeInferenceThread(FakeInference(str(model_dir), stop, respond=ChainModel(tokenizer))) as server:
        task, rollout = asyncio.run(go(server.url))
    return task.data.key, rollout


def test_a_chain_rollout_calls_the_service_once_per_key(tiny_model):
    with ToolService(p50_s=0.05, tail_ratio=1.0) as service:
        key, rollout = chain_rollout(tiny_model, service.url)
    assert rollout.error is None and rollout.reward == 1.0
    assert rollout.num_turns == len(chain(key)) + 1
    assert rollout.metrics["tool/calls"] == len(chain(key)) and rollout.metrics["tool/timeouts"] == 0
    latencies = Histogram("tool/latency_s")
    latencies.add_counts(rollout.metrics)
    assert latencies.count == len(chain(key)) and latencies.sum >= 0.05 * len(chain(key))
    assert len(rollout.samples) == 1, "the whole chain is one token-exact sample"


def test_a_timed_out_call_is_a_tool_message_and_the_episode_is_scored_on_its_answer(tiny_model):
    """The documented rule (`on_timeout = "message"`): the model reads the timeout and may call
    again; a chain it could not finish in `max_turns` scores the credit of the keys it called."""
    with ToolService(p50_s=0.01, timeout_rate=1.0) as service:
        key, rollout = chain_rollout(tiny_model, service.url, tool_timeout_s=0.2, max_turns=3)
    assert rollout.error is None and rollout.trainable
    assert rollout.metrics["tool/calls"] == 3 == rollout.metrics["tool/timeouts"], "called again after each timeout"
    assert rollout.reward == pytest.approx(CHAIN_CREDIT / len(chain(key))), "only the first key was ever called"


def test_with_on_timeout_error_a_timed_out_call_fails_the_rollout_untrained(tiny_model):
    with ToolService(p50_s=0.01, timeout_rate=1.0) as service:
        _, rollout = chain_rollout(tiny_model, service.url, tool_timeout_s=0.2, on_timeout="error")
    assert rollout.error is not None and "timed out" in rollout.error and not rollout.trainable


def test_an_unreachable_service_fails_the_rollout_untrained(tiny_model):
    _, rollout = chain_rollout(tiny_model, f"http://127.0.0.1:{free_port()}")
    assert rollout.error is not None and "tool service" in rollout.error and not rollout.trainable


def test_a_chain_rollout_survives_its_tool_service_restarting(tiny_model):
    """No rollout lost to a tool pod that went away: the call in flight is retried, the chain
    solved, the retries in the rollout's metrics."""
    with RestartedOnFirstCall(down_s=0.4, p50_s=0.3, tail_ratio=1.0) as service:
        key, rollout = chain_rollout(tiny_model, service.url, tool_timeout_s=8.0)
        assert service.restarts == 1
    assert rollout.error is None and rollout.reward == 1.0 and rollout.trainable
    assert rollout.metrics["tool/calls"] == len(chain(key)) and rollout.metrics["tool/errors"] == 0
    assert rollout.metrics["tool/retries"] >= 2


def test_histogram_quantiles_and_merge():
    h = Histogram("tool/latency_s", [0.03] * 50 + [0.15] * 49 + [30.0])
    assert (h.quantile(0.5), h.quantile(0.99), h.max) == (0.05, 0.2, 30.0)
    merged = Histogram("tool/latency_s")
    merged.add_counts(h.counts())
    merged.add_counts(h.counts())
    assert merged.count == 200 and merged.buckets == [2 * n for n in h.buckets]
    assert merged.sum == pytest.approx(2 * h.sum) and merged.max == 30.0
