"""`rlkube orchestrator`'s whole process against the shared real vLLM server, with a fake
trainer over real gRPC: real rollouts in the batches, and every reported policy loaded with
pause -> update_weights -> resume before the clock moves."""

import asyncio
import json
import threading
import urllib.request

import pytest
from rlkube.config import OrchestratorConfig
from rlkube.metrics import read_metrics
from rlkube.orchestrator.app import serve
from rlkube.transport.client import RolloutClient

from tests.fixtures.inference import free_port

pytestmark = pytest.mark.slow


def serve_beside_trainer(config: OrchestratorConfig, trainer, timeout: float) -> None:
    """Run the orchestrator process's `serve(config)` until it finishes, with `trainer` (its
    gRPC client's side) in a thread beside it."""
    thread = threading.Thread(target=trainer)
    thread.start()
    try:
        asyncio.run(asyncio.wait_for(serve(config), timeout=timeout))
    finally:
        thread.join(60)


def test_orchestrator_process_with_vllm(inference_server, tmp_path):
    grpc_port, http_port = free_port(), free_port()
    config = OrchestratorConfig.model_validate(
        {
            "output_dir": tmp_path, "max_steps": 3, "batch_size": 8, "group_size": 4, "seq_len": 128,
            "async_level": 1, "model": {"name": str(inference_server.model)},
            "sampling": {"max_tokens": 12}, "envs": [{"id": "reverse_text", "args": {"num_examples": 50}}],
            "client": {"base_urls": [inference_server.base_url], "max_concurrent": 16},
            "rollouts": {"port": grpc_port}, "http_port": http_port, "ckpt": {"interval": 2},
            "eval": {"interval": 2, "num_examples": 4, "envs": [{"id": "reverse_text", "args": {"split": "test", "num_examples": 4}}]},
        }
    )
    batches, statuses = {}, []

    def trainer():
        with RolloutClient(f"127.0.0.1:{grpc_port}", timeout_s=300) as client:
            for step in range(1, 4):
                batches[step] = client.get_batch(step, 0, 1, 2)
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/status") as r:
                    statuses.append(json.loads(r.read()))
                # the session's own weights, published as a snapshot: a real reload, same policy
                client.report_policy(step, inference_server.original_weights)

    serve_beside_trainer(config, trainer, timeout=400)

    assert sorted(batches) == [1, 2, 3]
    for micro_batches in batches.values():
        mb = micro_batches[0]
        # rows of seq_len, at most micro_batch_rows: a step whose samples fill one row (a group
        # of equal rewards filtered out, say) sends one
        rows, length = mb["input_ids"].shape
        assert length == 128 and 1 <= rows <= 2, mb["input_ids"].shape
        assert mb["global_loss_tokens"] == sum(int(m["loss_mask"].sum()) for m in micro_batches)
        # sampled tokens carry real (negative) vLLM logprobs and the sampling temperature
        sampled = mb["inference_logprobs"][mb["loss_mask"]]
        assert sampled.numel() == 0 or (sampled <= 0).all()
    assert statuses[0]["phase"] == "running" and statuses[0]["max_steps"] == 3
    records = read_metrics(tmp_path, "orchestrator")
    rewards = [r["reward/all/mean"] for r in records if "reward/all/mean" in r]
    assert len(rewards) == 3 and all(0 <= r <= 1 for r in rewards)
    assert [r["policy_step"] for r in records if "time/update_weights" in r] == [1, 2, 3]
    # vLLM's own weight-version tags reached every trained rollout (the lean path reads them)
    served = [r for r in records if "off_policy/served_rollouts" in r]
    assert len(served) == 3 and all(r["off_policy/served_lag/max"] <= 1 for r in served), served
    evals = [r["step"] for r in records if "eval/reverse_text/avg@1" in r]
    assert evals == [0, 2, 3], "eval at step 0, every 2 steps, and at the last step"
    assert (tmp_path / "checkpoints/orchestrator/step_2/COMPLETE").is_file()
    assert (tmp_path / "checkpoints/orchestrator/step_3/COMPLETE").is_file()
