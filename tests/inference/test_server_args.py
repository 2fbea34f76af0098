"""The mapping from InferenceConfig to vLLM's arguments and environment, read as vLLM reads
them: its own argument parser and engine arguments, its plugin loading in a fresh process. What
the CPU engine does with them is observed on the running engines (tests/inference/test_server.py:
context, KV cache, prefix cache, the generate and development routes; test_routing_capture.py:
routing captured on CPU); what only a GPU engine does is checked here, at vLLM's parser."""

import os
import subprocess
import sys

import pytest
from rlkube.config import InferenceConfig
from rlkube.inference.server import vllm_command
from vllm.engine.arg_utils import AsyncEngineArgs

from tests.fixtures.inference import vllm_args

# The busy-wait of a queue reader made after vLLM loaded its general plugins, as each of its
# processes does at start.
SPIN_OF_A_NEW_READER = """
import tempfile, zmq
from vllm.plugins import load_general_plugins
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
load_general_plugins()
reader = SpinCondition(is_reader=True, context=zmq.Context(), notify_address=f"ipc://{tempfile.mktemp()}")
print(reader.busy_loop_s)
"""


def engine_args(config: InferenceConfig, on_cpu: bool) -> AsyncEngineArgs:
    return AsyncEngineArgs.from_cli_args(vllm_args(config, on_cpu))


def test_gpu_defaults_and_extra_args():
    """A GPU engine cannot start here; vLLM's parser shows what it would run with."""
    config = InferenceConfig.model_validate({
        "model": {"name": "m", "dtype": "auto"}, "kv_cache_space_gb": 4,
        "enable_prefix_caching": False,
        "extra_args": {"tensor_parallel_size": 2, "enable_chunked_prefill": True, "hf_overrides": {"x": [1]}},
    })
    args = engine_args(config, on_cpu=False)
    assert args.dtype == "bfloat16" and args.gpu_memory_utilization == 0.9
    assert args.weight_transfer_config.backend == "nccl"  # the NCCL weight path's routes
    assert args.enable_prefix_caching is False
    assert args.tensor_parallel_size == 2 and args.enable_chunked_prefill is True and args.hf_overrides == {"x": [1]}
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_command(config, on_cpu=False).env


def test_routed_experts_come_from_vllms_model_runner_v2_on_gpu():
    """vLLM returns routing only from its Model Runner V2 (it needs Triton: GPU only, so the
    variable that selects it is checked as written). On CPU rlkube's worker captures routing
    instead, observed on the session's MoE engine (test_routing_capture.py)."""
    config = InferenceConfig.model_validate({"return_routed_experts": True})
    args = engine_args(config, on_cpu=False)
    assert args.enable_return_routed_experts and args.enable_prefix_caching
    assert vllm_command(config, on_cpu=False).env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert not engine_args(config, on_cpu=True).enable_return_routed_experts


@pytest.mark.parametrize(("settings", "on_cpu", "spin_s"), [
    ({}, True, 0.005),  # CPU: 5 ms
    ({}, False, 1.0),  # GPU: vLLM's own
    ({"shm_spin_ms": 0.5}, True, 0.0005),
    ({"shm_spin_ms": 0.5}, False, 0.0005),
])
def test_shm_spin_reaches_vllms_queues(settings, on_cpu, spin_s):
    env = vllm_command(InferenceConfig.model_validate(settings), on_cpu).env
    done = subprocess.run([sys.executable, "-c", SPIN_OF_A_NEW_READER], env=os.environ | env, capture_output=True,
                          text=True, timeout=120, check=True)
    assert float(done.stdout.split()[-1]) == spin_s


def test_router_replay_asks_inference_for_routed_experts():
    from rlkube.config import RLConfig

    def served(**loss) -> bool:
        config = RLConfig.model_validate({"trainer": {"loss": loss}})
        return config.process_configs()["inference"].return_routed_experts

    assert served(router_replay=True) and not served()


def test_dry_run_prints_resolved_config(capsys, tmp_path):
    from rlkube.entrypoints.inference import main

    (tmp_path / "config.json").write_text("{}")
    assert main(["--model.name", str(tmp_path), "--port", "9000", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f'name = "{tmp_path}"' in out and "port = 9000" in out


def test_inference_process_refuses_a_taken_port(tmp_path):
    import socket

    from rlkube.inference.process import InferenceProcess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = InferenceConfig.model_validate({"model": {"name": "/m"}, "port": port})
        with pytest.raises(RuntimeError, match=f"inference.port: 127.0.0.1:{port} is in use"):
            InferenceProcess(config, tmp_path).start()


def test_the_models_generation_defaults_do_not_reach_training_requests(tmp_path):
    """vLLM's own config reading, on a model whose generation_config.json carries Qwen3's
    sampling defaults: with rlkube's arguments no default reaches a request (the trainer models
    exactly the configured sampling); `extra_args` can still ask for them."""
    import json

    from rlkube.models.tiny import init_tiny_model

    model = init_tiny_model(tmp_path / "model")
    path = model / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"top_k": 20, "top_p": 0.95}))

    def request_defaults(**extra_args) -> dict:
        config = InferenceConfig.model_validate({"model": {"name": str(model)}, "extra_args": extra_args})
        return engine_args(config, on_cpu=True).create_model_config().get_diff_sampling_param()

    assert request_defaults() == {}
    assert request_defaults(generation_config="auto") == {"top_k": 20, "top_p": 0.95}
