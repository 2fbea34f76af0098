"""Rollouts of a real verifiers environment through verifiers' token-in/token-out training
client: against an instant fake `/inference/v1/generate` (fast), and against the shared real
vLLM server (slow)."""

import asyncio
import re

import pytest
from rlkube.config import ClientConfig, DifficultyConfig, EnvConfig, SamplingConfig
from rlkube.envs import load_env
from rlkube.orchestrator.inference import InferencePool, pick_replica
from rlkube.orchestrator.rollouts import EnvRunner, TaskSampler

from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread


def reverse_user_text(tokenizer):
    """A perfect policy for reverse_text: answer with the user's text reversed."""

    def respond(prompt_ids):
        prompt = tokenizer.decode(prompt_ids)
        text = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, re.DOTALL)[-1]
        return tokenizer.encode(text[::-1], add_special_tokens=False)

    return respond


async def run_rollouts(model, base_urls, n, sampling: SamplingConfig, path: str = "auto"):
    env_config = EnvConfig(args={"num_examples": 20}, rollout_path=path)
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    assert runner.rollout_path == ("verifiers" if path == "verifiers" else "lean")
    pool = InferencePool(ClientConfig(base_urls=base_urls), str(model), str(model), sampling)
    async def one(example_id, task):
        return await runner.rollout(task, example_id, pool.context_for(runner.name, example_id), sampling.temperature, lambda: 3)

    async with runner.serving():
        tasks = [runner.next_task() for _ in range(n)]
        # One rollout alone first: `renderers` resolves each new server's context length under a
        # module-level asyncio.Lock, which breaks when contended in two event loops of one
        # process (pytest runs each test in its own loop; the orchestrator has only one).
        first = await one(*tasks[0])
        return [first, *await asyncio.gather(*(one(*t) for t in tasks[1:]))]


@pytest.mark.parametrize("path", ["lean", "verifiers"])
def test_token_exact_rollouts_against_a_fake_engine(tiny_model, path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    fake = FakeInference(str(tiny_model), stop, respond=reverse_user_text(tokenizer))
    with FakeInferenceThread(fake) as server:
        rollouts = asyncio.run(run_rollouts(tiny_model, [server.url], 4, SamplingConfig(max_tokens=32), path))
    for rollout in rollouts:
        assert rollout.error is None and (rollout.policy_min, rollout.policy_max) == (3, 3)
        assert rollout.reward == 1.0, "the completion ids decode to the reversed text"
        (sample,) = rollout.samples
        completion = [t for t, m in zip(sample.token_ids, sample.loss_mask) if m]
        assert tokenizer.decode(completion[:-1])[::-1] in tokenizer.decode(sample.token_ids[: sample.loss_mask.index(True)])
        assert completion[-1] == stop
        assert [lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m] == [-0.25] * len(completion)
        assert sample.loss_mask[: sample.loss_mask.index(True)] == [False] * sample.loss_mask.index(True)
    assert fake.generate_requests == 4


def test_sticky_routing_is_stable_and_spreads():
    urls = [f"http://run-inference-{i}.run-inference:8000" for i in range(3)]
    replicas = [pick_replica("reverse_text", str(i), urls) for i in range(300)]
    assert replicas == [pick_replica("reverse_text", str(i), list(reversed(urls))) for i in range(300)]
    assert all(replicas.count(url) > 60 for url in urls)


def test_a_scale_or_a_replica_down_moves_only_the_tasks_it_must():
    """Prefix caches survive elasticity: a fourth replica takes about a quarter of the tasks
    (from every other replica alike), and a replica that is down hands over only its own."""
    urls = [f"http://run-inference-{i}.run-inference:8000" for i in range(4)]
    tasks = [str(i) for i in range(2000)]
    on_three = {t: pick_replica("reverse_text", t, urls[:3]) for t in tasks}
    on_four = {t: pick_replica("reverse_text", t, urls) for t in tasks}
    moved = [t for t in tasks if on_four[t] != on_three[t]]
    assert {on_four[t] for t in moved} == {urls[3]}, "a task moves only to the replica that joined"
    assert 0.2 < len(moved) / len(tasks) < 0.3, f"{len(moved)} of {len(tasks)} tasks moved for one replica of four"
    without_1 = {t: pick_replica("reverse_text", t, [u for u in urls if u != urls[1]]) for t in tasks}
    assert [t for t in tasks if without_1[t] != on_four[t]] == [t for t in tasks if on_four[t] == urls[1]]


def test_task_sampler_covers_every_task_each_epoch_and_resumes():
    sampler = TaskSampler(5, seed=1)
    first = [sampler.next() for _ in range(5)]
    assert sorted(first) == list(range(5))
    sampler.next()
    resumed = TaskSampler(5, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    assert [resumed.next() for _ in range(4)] == [sampler.next() for _ in range(4)]


def test_easy_and_hard_tasks_run_at_their_keep_rate_and_come_back_when_relabelled():
    difficulty = DifficultyConfig(easy_keep=0.0, hard_keep=0.5)
    sampler = TaskSampler(10, seed=3, difficulty=difficulty)
    sampler.record(2, 1.0)  # solved: easy
    sampler.record(5, 0.0)  # never solved: hard
    sampler.record(7, 0.5)  # in between: unlabelled
    epochs = [[sampler.next() for _ in range(8)] for _ in range(200)]  # 8 = 10 tasks - 1 easy - ~half a hard
    drawn = [t for epoch in epochs for t in epoch]
    assert drawn.count(2) == 0, "an easy task with easy_keep 0 never runs again"
    assert 0.35 < drawn.count(5) / drawn.count(7) < 0.65, (drawn.count(5), drawn.count(7))
    assert 0.45 * len(drawn) / 9.5 < drawn.count(7), "unlabelled tasks run every turn"

    resumed = TaskSampler(10, seed=3, difficulty=difficulty)
    resumed.load_state_dict(sampler.state_dict())
    assert [resumed.next() for _ in range(50)] == [sampler.next() for _ in range(50)], "the same skips"
    sampler.record(2, 0.4)  # it became hard to solve again: back in the rotation
    assert 2 in [sampler.next() for _ in range(10)]


def test_a_pass_of_only_skipped_tasks_still_gives_a_task():
    sampler = TaskSampler(3, seed=0, difficulty=DifficultyConfig(easy_keep=0.0))
    for task in range(3):
        sampler.record(task, 1.0)
    assert all(0 <= sampler.next() < 3 for _ in range(3)), "a task, after a whole pass of skips"
    assert sampler.skipped == 6


@pytest.mark.slow
@pytest.mark.parametrize("path", ["lean", "verifiers"])
def test_real_rollouts_from_vllm(inference_server, path):
    """Token ids and logprobs come from vLLM through verifiers' training client."""
    sampling = SamplingConfig(temperature=1.0, max_tokens=16)
    rollouts = asyncio.run(run_rollouts(inference_server.model, [inference_server.base_url], 4, sampling, path))
    for rollout in rollouts:
        assert rollout.error is None, rollout.error
        (sample,) = rollout.samples
        n = sum(sample.loss_mask)
        assert 1 <= n <= 16
        assert len(sample.token_ids) == len(sample.logprobs) == len(sample.loss_mask)
        sampled = [lp for lp, m in zip(sample.logprobs, sample.loss_mask) if m]
        assert all(lp <= 0.0 for lp in sampled) and any(lp < 0.0 for lp in sampled)
        assert 0.0 <= rollout.reward <= 1.0


@pytest.mark.parametrize("path", ["lean", "verifiers"])
def test_multi_turn_rollout_is_one_token_exact_sample(tiny_model, path):
    """verifiers' user-simulator env (the simulated user is an untrainable agent): a 3-turn
    conversation whose turns extend each other exactly becomes ONE sample, with only the
    assistant's sampled tokens in the loss mask; the user's own trace is not trained on."""
    import verifiers.v1 as vf
    from rlkube.envs.chat_harness import HARNESS_ID
    from rlkube.envs.reverse_text import TASKSET_ID, ReverseTextConfig
    from transformers import AutoTokenizer
    from verifiers.v1.envs.user_sim.env import UserSimEnv, UserSimEnvConfig

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply = tokenizer.encode("hello there", add_special_tokens=False)
    agent = {"harness": {"id": HARNESS_ID}, "runtime": {"type": "subprocess"}}
    env = UserSimEnv(UserSimEnvConfig(
        taskset=ReverseTextConfig(id=TASKSET_ID, num_examples=4), assistant=agent, user=agent | {"max_turns": 3},
    ))
    assert isinstance(env, vf.Env)
    runner = EnvRunner(EnvConfig(name="user_sim", rollout_path=path), env, seed=0)

    async def go(url):
        pool = InferencePool(ClientConfig(base_urls=[url]), str(tiny_model), str(tiny_model), SamplingConfig(max_tokens=16))
        async with runner.serving():
            example_id, task = runner.next_task()
            return await runner.rollout(task, example_id, pool.context_at(pool.base_urls[0]), 1.0, lambda: 0)

    with FakeInferenceThread(FakeInference(str(tiny_model), stop, respond=lambda ids: reply)) as server:
        rollout = asyncio.run(go(server.url))
    assert rollout.error is None and rollout.num_turns == 3
    (sample,) = rollout.samples
    sampled = [t for t, m in zip(sample.token_ids, sample.loss_mask) if m]
    assert sampled == (reply + [stop]) * 3
    text = tokenizer.decode(sample.token_ids)
    assert text.count("<|im_start|>assistant\nhello there<|im_end|>") == 3
    assert "role-playing a USER" not in text
