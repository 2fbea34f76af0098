"""Rollouts scored by the run's judge: a real verifiers environment (judged reverse-text, whose
reward is verifiers' reference judge) with its judge pointed at the loopback endpoint
(`rlkube.orchestrator.judge`), against an instant fake policy engine and a fake judge whose
verdict depends on the task. The same through the shared real vLLM server is in
test_judge_vllm.py."""

import asyncio
import re
import threading
import time

import pytest
from aiohttp import web
from rlkube.config import ClientConfig, EnvConfig, JudgeConfig, SamplingConfig
from rlkube.envs import load_env
from rlkube.orchestrator.inference import InferencePool
from rlkube.orchestrator.judge import JUDGE_UNAVAILABLE, JudgeEndpoint
from rlkube.orchestrator.rollouts import EnvRunner, Reissuer, run_group
from rlkube.orchestrator.samples import sample_rows
from rlkube.orchestrator.types import Batch
from rlkube.ports import free_port
from rlkube.scopes import GENERATE, scoped

from tests.fixtures.network import UnansweredPort
from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread
from tests.orchestrator.test_judge_vllm import judge_calls

TOKEN = "the-run-token"


def verdict_for(answer: str) -> str:
    """The fake judge's verdict on a task, by its reference answer: varied across tasks."""
    return "yes" if answer[0] < "n" else "no"


class FakeJudge:
    """vLLM's `/v1/chat/completions` answering `verdict_for` the reference answer in the prompt
    (verifiers' reference judge prompt); records each request's model and Authorization."""

    def __init__(self):
        self.models: list[str] = []
        self.authorizations: list[str | None] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.models.append(body["model"])
        self.authorizations.append(request.headers.get("Authorization"))
        prompt = body["messages"][-1]["content"]
        answer = re.search(r"Reference answer:\n```\n(.*?)\n```", prompt, re.DOTALL).group(1)
        message = {"role": "assistant", "content": verdict_for(answer)}
        return web.json_response({
            "id": "j", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })


async def judged_groups(model, inference_url: str, judge: JudgeConfig, groups: int, group_size: int = 2):
    """(task, rollouts, endpoint metrics, rollouts re-issued) of `groups` groups of judged
    reverse-text, run as the orchestrator runs them (`run_group` under a `Reissuer`)."""
    env_config = EnvConfig(id="judged_reverse_text", args={"num_examples": 20})
    async with JudgeEndpoint(judge) as endpoint:
        runner = EnvRunner(env_config, load_env(env_config, endpoint.target), seed=0)
        pool = InferencePool(ClientConfig(base_urls=[inference_url]), str(model), str(model), SamplingConfig(max_tokens=24))

        async def group_of(runner, example_id, task, size):
            return await run_group(runner, pool, example_id, task, size, 1.0, lambda: 0)

        reissuer = Reissuer(group_of, retry_after_s=0.2)
        async with runner.serving():
            tasks = [runner.next_task() for _ in range(groups)]
            results = [(task, await reissuer(runner, example_id, task, group_size)) for example_id, task in tasks]
        return results, endpoint.metrics(), reissuer.reissued


@pytest.fixture
def policy(tiny_model, monkeypatch):
    """A fake policy engine answering every prompt with a few tokens; the run's token set."""
    from transformers import AutoTokenizer

    monkeypatch.setenv("RLKUBE_TOKEN", TOKEN)
    stop = AutoTokenizer.from_pretrained(tiny_model).convert_tokens_to_ids("<|im_end|>")
    with FakeInferenceThread(FakeInference(str(tiny_model), stop, completion_len=5)) as server:
        yield server.url


def assert_scored_by_the_judge(results) -> None:
    for task, group in results:
        for rollout in group:
            assert rollout.error is None, rollout.error
            assert rollout.reward == (1.0 if verdict_for(task.data.answer) == "yes" else 0.0)
    rewards = {r.reward for _, group in results for r in group}
    assert rewards == {0.0, 1.0}, "the tasks drew both verdicts"


def test_rewards_are_the_judges_verdicts_and_its_calls_carry_the_generate_credential(tiny_model, policy):
    judge = FakeJudge()
    with FakeInferenceThread(judge) as server:
        config = JudgeConfig(model="the-judge", base_urls=[server.url], served_by_run=True)
        results, metrics, reissued = asyncio.run(judged_groups(tiny_model, policy, config, groups=8))
    assert_scored_by_the_judge(results)
    assert judge.models == ["the-judge"] * 16 and judge.authorizations == [f"Bearer {scoped(TOKEN, GENERATE)}"] * 16
    assert metrics["judge/requests"] == 16 and metrics["judge/errors"] == 0 and metrics["judge/latency_s"] > 0
    assert reissued == 0


def test_the_batchs_samples_count_the_judge_calls_that_scored_it(tiny_model, policy):
    """`judge_calls` on a batch's samples file rows (`sample_rows`, as the orchestrator writes
    them) counts the calls the judge received for its rollouts; an errored rollout's none."""
    from transformers import AutoTokenizer

    judge = FakeJudge()
    with FakeInferenceThread(judge) as server:
        config = JudgeConfig(model="the-judge", base_urls=[server.url])
        results, _, _ = asyncio.run(judged_groups(tiny_model, policy, config, groups=4))
    rows = sample_rows(Batch(1, [r for _, group in results for r in group]), AutoTokenizer.from_pretrained(tiny_model))
    assert judge_calls(rows) == len(judge.models) == 8
    rows[0]["error"], rows[1]["completion"] = "boom", "<|im_end|>"
    assert judge_calls(rows) == 6


def start_later(server: FakeInferenceThread, delay_s: float) -> threading.Timer:
    timer = threading.Timer(delay_s, server.__enter__)
    timer.start()
    return timer


@pytest.mark.parametrize("wait_s", [30.0, 0.5], ids=["waited-out", "reissued"])
def test_a_judge_that_is_down_makes_its_rollouts_wait_or_run_again_never_score_zero(tiny_model, policy, wait_s):
    """The judge's port refuses connections for 2 s, then the judge comes up. With a long
    `wait_s` the judge calls wait it out; with a short one they fail with `JUDGE_UNAVAILABLE`
    and their rollouts are re-issued until the judge answers. Either way every reward is the
    judge's verdict."""
    judge, port = FakeJudge(), free_port()
    server = FakeInferenceThread(judge, port=port)
    timer = start_later(server, 2.0)
    started = time.monotonic()
    try:
        config = JudgeConfig(model="the-judge", base_urls=[server.url], wait_s=wait_s)
        results, metrics, reissued = asyncio.run(judged_groups(tiny_model, policy, config, groups=4))
    finally:
        timer.join()
        server.__exit__()
    assert time.monotonic() - started >= 2.0
    assert_scored_by_the_judge(results)
    assert metrics["judge/errors"] >= 2, "each refused attempt is counted"
    if wait_s > 2:
        assert reissued == 0 and metrics["judge/requests"] == 8
    else:
        assert reissued >= 1 and metrics["judge/requests"] > 8


def test_past_its_wait_the_endpoint_answers_503_naming_the_judge():
    async def call():
        async with JudgeEndpoint(JudgeConfig(model="j", base_urls=[f"http://127.0.0.1:{free_port()}"], wait_s=0.2)) as e:
            from openai import AsyncOpenAI, InternalServerError

            client = AsyncOpenAI(base_url=e.url, api_key="none", max_retries=0)
            with pytest.raises(InternalServerError, match=JUDGE_UNAVAILABLE):
                await client.chat.completions.create(model="j", messages=[{"role": "user", "content": "?"}])
            return e.metrics()

    metrics = asyncio.run(call())
    assert metrics["judge/requests"] == 1 and metrics["judge/errors"] >= 1


def test_a_judge_whose_address_answers_nothing_is_given_up_within_its_wait():
    """The judge pod is gone and its address, still cached, swallows the dial: each attempt
    gives up after `CONNECT_TIMEOUT_S` and is retried, so the endpoint keeps to `wait_s` (here
    answering 503) instead of one dial waiting out the kernel's ~2 minutes."""
    silent = UnansweredPort()

    async def call():
        config = JudgeConfig(model="j", base_urls=[f"http://127.0.0.1:{silent.port}"], wait_s=6)
        async with JudgeEndpoint(config) as e:
            from openai import AsyncOpenAI, InternalServerError

            client = AsyncOpenAI(base_url=e.url, api_key="none", max_retries=0, timeout=600)
            with pytest.raises(InternalServerError, match=f"{JUDGE_UNAVAILABLE}.*ConnectionTimeoutError"):
                await asyncio.wait_for(
                    client.chat.completions.create(model="j", messages=[{"role": "user", "content": "?"}]), 60
                )
            return e.metrics()

    started = time.monotonic()
    try:
        metrics = asyncio.run(call())
    finally:
        silent.close()
    assert metrics["judge/errors"] >= 2, "the dial was retried"
    print(f"503 after {time.monotonic() - started:.1f} s")
