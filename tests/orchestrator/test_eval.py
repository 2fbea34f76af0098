"""The eval runner: avg@k / pass@k arithmetic, and `rlkube eval` against the shared server."""

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
    from rlkube.orchestrator.eval import periodic_eval
    from rlkube.orchestrator.inference import InferencePool

    from tests.orchestrator.fake_inference import FakeInference, FakeInferenceThread

    with FakeInferenceThread(FakeInference(str(tiny_model), stop_token_id=3)) as server:
        config = OrchestratorConfig.model_validate({
            "output_dir": tmp_path, "model": {"name": str(tiny_model)},
            "client": {"base_urls": [server.url], "lora_adapter": POLICY_ADAPTER},
            "eval": {"num_examples": 3, "sampling": {"max_tokens": 8}},
        })
        pool = InferencePool(config.client, config.model.name, config.model.name, config.sampling)
        evaluate = periodic_eval(config, lambda: pool.request_model, lambda: pool.base_urls)

        async def steps():
            at_0 = await evaluate(0)
            await pool.load_policy(1, "/w/step_1", 60)
            return at_0, await evaluate(1)

        metrics = asyncio.run(steps())
    assert all(m["eval/reverse_text/errored_rollouts"] == 0 for m in metrics)
    assert server.fake.requested_models == [str(tiny_model)] * 3 + [POLICY_ADAPTER] * 3
