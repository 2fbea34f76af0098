"""On-policy distillation in the orchestrator: the teacher's log-probs of exactly the sampled
tokens, from a fake teacher (requests, failures, a whole run over gRPC) and from the shared
real vLLM server (the values)."""

import asyncio
import json

import pytest
from aiohttp import web
from rlkube.config import TeacherConfig
from rlkube.orchestrator.orchestrator import Orchestrator
from rlkube.orchestrator.teacher import Teacher
from rlkube.rollout_types import Rollout

from tests.orchestrator.fake_inference import FakeInferenceThread
from tests.orchestrator.helpers import make_rollout
from tests.orchestrator.test_orchestrator import FakePool, FakeRunner, make_config, run_with_trainer


def teacher_logprob(token: int) -> float:
    return -token / 1000


class FakeTeacher:
    """vLLM's `/v1/completions` with `prompt_logprobs`: token t has log-prob -t/1000; records
    each request and the most requests it had in flight at once."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.requests: list[dict] = []
        self.in_flight = self.peak_in_flight = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", lambda r: web.json_response({}))
        return app

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.fail:
            return web.json_response({"error": {"message": "the teacher is overloaded"}}, status=503)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        entries = [None] + [{str(t): {"logprob": teacher_logprob(t), "rank": 1}} for t in body["prompt"][1:]]
        return web.json_response({"choices": [{"text": "x", "prompt_logprobs": entries}]})


def test_the_teacher_scores_every_sampled_token_of_trainable_rollouts():
    fake = FakeTeacher()
    group = [make_rollout(1.0, completion_len=n) for n in (2, 3, 4, 5)]
    errored = Rollout("e", "x", 0.0, [], 0, 0, error="ProviderError: boom")
    with FakeInferenceThread(fake) as server:
        teacher = Teacher(TeacherConfig(model="the-teacher", base_urls=[server.url], max_concurrent=2))
        asyncio.run(teacher.score_group([*group, errored]))
    assert len(fake.requests) == 4, "one request per sample; the errored rollout is not scored"
    assert fake.peak_in_flight <= 2, "max_concurrent bounds the requests in flight"
    for rollout in group:
        (sample,) = rollout.samples
        assert {"prompt": sample.token_ids, "max_tokens": 1, "prompt_logprobs": 0, "model": "the-teacher"} in fake.requests
        assert sample.teacher_logprobs == [
            teacher_logprob(t) if trained else 0.0 for t, trained in zip(sample.token_ids, sample.loss_mask)
        ]
        assert rollout.trainable


def test_a_rollout_the_teacher_cannot_score_is_not_trained():
    with FakeInferenceThread(FakeTeacher(fail=True)) as server:
        teacher = Teacher(TeacherConfig(model="the-teacher", base_urls=[server.url]))
        (rollout,) = asyncio.run(teacher.score_group([make_rollout(1.0)]))
    assert rollout.error.startswith("TeacherError: ") and "the teacher is overloaded" in rollout.error
    assert not rollout.trainable


def test_teacher_logprobs_survive_the_checkpoint_state():
    rollout = make_rollout(1.0)
    rollout.samples[0].teacher_logprobs = [0.0, 0.0, 0.0, -0.1, -0.2, -0.3, -0.4]
    assert Rollout.from_dict(json.loads(json.dumps(rollout.to_dict()))) == rollout
    unscored = make_rollout(1.0).to_dict()
    del unscored["samples"][0]["teacher_logprobs"]  # a checkpoint from before distillation existed
    assert Rollout.from_dict(unscored).samples[0].teacher_logprobs is None


class SameRewardRunner(FakeRunner):
    """Every rollout scores 1: every group's advantages are zero."""

    async def rollout(self, *args):
        rollout = await super().rollout(*args)
        rollout.reward = 1.0
        return rollout


def test_a_distillation_run_trains_on_zero_advantage_groups_with_teacher_logprobs(tmp_path):
    """Over real gRPC: with a teacher, all-equal-reward groups are not filtered out, and every
    micro-batch carries the teacher's log-probs on its loss tokens."""
    fake = FakeTeacher()
    with FakeInferenceThread(fake) as server:
        config = make_config(
            tmp_path, max_steps=2, filter_zero_advantage=True, teacher={"model": "t", "base_urls": [server.url]}
        )
        orchestrator = Orchestrator(config, [SameRewardRunner()], FakePool(), lambda m, s: None)
        results = asyncio.run(run_with_trainer(orchestrator, config, world_size=1))
    for (micro_batches,) in results.values():
        assert micro_batches[0]["global_loss_tokens"] == 4 * 2, "no sample was filtered"
        for mb in micro_batches:
            mask = mb["loss_mask"]
            assert mb["advantages"][mask].abs().sum() == 0
            assert mb["teacher_logprobs"][mask].tolist() == pytest.approx((-mb["input_ids"][mask] / 1000).tolist())
            assert not mb["teacher_logprobs"][~mask].any()


@pytest.mark.slow
def test_teacher_logprobs_equal_the_servers_sampling_logprobs(inference_server):
    """The shared vLLM server as the teacher: its prompt log-probs of a sequence it sampled
    itself (seeded, temperature 1) equal the log-probs it reported while sampling it."""
    from rlkube.inference.client import post

    prompt = [3, 17, 42, 8, 99, 5]

    async def sample_then_score() -> tuple[list[int], list[float], list[float]]:
        request = {
            "model": inference_server.model_name, "prompt": prompt, "max_tokens": 12, "temperature": 1.0,
            "seed": 7, "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
        }
        choice = (await post(inference_server.base_url, "/v1/completions", 120, json=request)).json()["choices"][0]
        teacher = Teacher(TeacherConfig(model=inference_server.model_name, base_urls=[inference_server.base_url],
                                             served_by_run=True))
        scored = await teacher.token_logprobs(inference_server.base_url, prompt + choice["token_ids"])
        return choice["token_ids"], choice["logprobs"]["token_logprobs"], scored

    completion, sampled, scored = asyncio.run(sample_then_score())
    assert len(completion) == 12
    assert scored[len(prompt):] == pytest.approx(sampled, abs=1e-3)
    assert all(lp <= 0 for lp in scored) and scored[0] == 0.0
