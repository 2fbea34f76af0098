"""The eval runner: avg@k / pass@k arithmetic, `rlkube eval` against the shared server, and the
orchestrator's periodic eval against fake engines over real HTTP."""

import json

import pytest
from rlkube.orchestrator.eval import EvalResult


def test_avg_and_pass_at_k_by_hand():
    result = EvalResult("env", k=2, pass_threshold=0.9, rewards=[[1.0, 0.0], [0.5, 0.5], [0.95, 0.9]])
    assert result.avg_at_k == pytest.approx((1.0 + 0.0 + 0.5 + 0.5 + 0.95 + 0.9) / 6)
    assert result.pass_at_k == pytest.approx(2 / 3)  # examples 0 and 2 have a passing rollout
    assert result.pass_rate == pytest.approx(3 / 6)
    metrics = result.metrics()
    assert metrics["eval/env/avg@2"] == result.avg_at_k and metrics["eval/env/pass@2"] == result.pass_at_k


def test_empty_result_is_zero_not_an_error():
    result = EvalResult("env", k=1, pass_threshold=1.0)
    assert (result.avg_at_k, result.pass_at_k, result.pass_rate) == (0.0, 0.0, 0.0)


@pytest.mark.slow
def test_rlkube_eval_against_running_server(inference_server, tmp_path):
    from rlkube.entrypoints.eval import main

    code = main([
        "--base-url", inference_server.base_url, "--model.name", inference_server.model_name,
        "--num-examples", "3", "--rollouts-per-example", "2", "--sampling.max-tokens", "16",
        "--output-dir", str(tmp_path),
    ])
    assert code == 0
    results = json.loads((tmp_path / "eval_results.json").read_text())["results"]
    assert [r["env"] for r in results] == ["reverse_text"]
    result = results[0]
    assert result["num_examples"] == 3 and result["errors"] == []
    rewards = [r for group in result["rewards"] for r in group]
    assert len(rewards) == 6 and all(0.0 <= r <= 1.0 for r in rewards)
    assert result["avg_at_k"] == pytest.approx(sum(rewards) / 6)


def test_periodic_eval_asks_for_the_policy_the_replicas_serve(tiny_model, tmp_path):
    """In a LoRA run served as an adapter, the orchestrator's eval of policy 0 asks for the
    base model, and of later policies for the adapter they are served as (asked for the base
    model, it would score policy 0 at every step)."""
    import asyncio

    from rlkube.config import OrchestratorConfig
    from rlkube.config.inference import POLICY_ADAPTER
    from rlkube.orchestrator.eval import EVAL_REWARD, periodic_eval
    from rlkube.orchestrator.inference import InferencePool

    from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

    with FakeInferenceThread(FakeInference(str(tiny_model), stop_token_id=3)) as server:
        config = OrchestratorConfig.model_validate({
            "output_dir": tmp_path, "model": {"name": str(tiny_model)},
            "client": {"base_urls": [server.url], "lora_adapter": POLICY_ADAPTER},
            "eval": {"num_examples": 3, "sampling": {"max_tokens": 8}},
        })
        pool = InferencePool(config.client, config.model.name, config.model.name, config.sampling)
        evaluate = periodic_eval(config, pool)

        async def steps():
            at_0 = await evaluate(0)
            await pool.load_policy(1, "/w/step_1", 60)
            return at_0, await evaluate(1)

        metrics = asyncio.run(steps())
    assert all(m["eval/reverse_text/errored_rollouts"] == 0 for m in metrics)
    assert all(m[EVAL_REWARD] == m["eval/reverse_text/avg@1"] for m in metrics)  # one env: its avg@k
    assert server.fake.requested_models == [str(tiny_model)] * 3 + [POLICY_ADAPTER] * 3


def test_a_periodic_eval_rollout_that_loses_its_replica_runs_again_on_the_other(tiny_model, tmp_path):
    """Replica 1 dies with eval requests in flight: they run again on replica 0 and score on
    their merits, none as an error (scored as errors, they would lower the held-out reward of a
    policy for a pod's restart)."""
    import asyncio
    import contextlib

    from rlkube.config import OrchestratorConfig
    from rlkube.envs import load_env
    from rlkube.orchestrator.eval import periodic_eval
    from rlkube.orchestrator.inference import InferencePool, pick_replica

    from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(FakeInferenceThread(FakeInference(str(tiny_model), stop_token_id=3)))
                   for _ in range(2)]
        servers[1].fake.hang = True  # its requests hang until it dies
        config = OrchestratorConfig.model_validate({
            "output_dir": tmp_path, "model": {"name": str(tiny_model)},
            "client": {"base_urls": [s.url for s in servers], "resync_interval_s": 60},
            "eval": {"num_examples": 16, "rollouts_per_example": 2, "sampling": {"max_tokens": 8}},
        })
        tasks = list(load_env(config.eval.envs[0]).taskset)[:16]
        urls = [s.url for s in servers]
        on_replica_1 = 2 * sum(pick_replica("reverse_text", str(t.key), urls) == urls[1] for t in tasks)
        assert 0 < on_replica_1 < 32, "the test needs tasks on both replicas"
        pool = InferencePool(config.client, config.model.name, config.model.name, config.sampling)
        evaluate = periodic_eval(config, pool)

        async def eval_while_replica_1_dies():
            running = asyncio.ensure_future(evaluate(0))
            while servers[1].fake.generate_requests < on_replica_1 and not running.done():
                await asyncio.sleep(0.05)
            await asyncio.to_thread(servers[1].__exit__)
            return await running

        metrics = asyncio.run(eval_while_replica_1_dies())
    assert metrics["eval/reverse_text/errored_rollouts"] == 0
    assert metrics["eval/reverse_text/reissued_rollouts"] == on_replica_1
    assert servers[0].fake.generate_requests == 32, "every rollout was answered by replica 0 in the end"
