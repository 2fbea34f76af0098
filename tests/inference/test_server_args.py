"""The mapping from InferenceConfig to vLLM's arguments and environment (no vLLM started)."""

from rlkube.config import InferenceConfig
from rlkube.inference.generate_mode import CAPTURE_ROUTING_ENV
from rlkube.inference.server import WORKER_EXTENSION, vllm_command
from rlkube.inference.vllm_plugin import SPIN_ENV


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_cpu_defaults():
    config = InferenceConfig.model_validate(
        {"model": {"name": "/m"}, "port": 8123, "kv_cache_space_gb": 2, "max_model_len": 512}
    )
    command = vllm_command(config, on_cpu=True)
    args = command.args
    assert value(args, "--model") == "/m" and value(args, "--port") == "8123"
    assert value(args, "--dtype") == "float32"  # auto -> fp32 on CPU: matches the trainer
    assert value(args, "--worker-extension-cls") == WORKER_EXTENSION
    assert value(args, "--logprobs-mode") == "processed_logprobs"
    assert value(args, "--max-model-len") == "512"
    assert "--enable-scale-out" in args  # /inference/v1/generate
    assert "--gpu-memory-utilization" not in args and "--weight-transfer-config" not in args
    assert command.env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert command.env["VLLM_SERVER_DEV_MODE"] == "1"  # /pause, /resume, /collective_rpc
    assert command.env[SPIN_ENV] == "5"  # short busy-wait on CPU by default


def test_gpu_and_extra_args():
    config = InferenceConfig.model_validate({
        "model": {"name": "m", "dtype": "auto"}, "kv_cache_space_gb": 4,
        "enable_prefix_caching": False,
        "extra_args": {"tensor_parallel_size": 2, "enable_chunked_prefill": True, "x_list": [1]},
    })
    command = vllm_command(config, on_cpu=False)
    args = command.args
    assert value(args, "--dtype") == "bfloat16"
    assert value(args, "--gpu-memory-utilization") == "0.9"
    assert value(args, "--weight-transfer-config") == '{"backend": "nccl"}'
    assert "--no-enable-prefix-caching" in args
    assert value(args, "--tensor-parallel-size") == "2"
    assert "--enable-chunked-prefill" in args and value(args, "--x-list") == "[1]"
    assert "VLLM_CPU_KVCACHE_SPACE" not in command.env
    assert SPIN_ENV not in command.env  # vLLM's own spin on GPU unless asked


def test_routed_experts_come_from_vllm_on_gpu_and_from_rlkube_on_cpu():
    """vLLM returns them only from its Model Runner V2 (needs Triton: GPU); on CPU rlkube's
    worker captures them, eagerly and without a prefix cache (rlkube.inference.routing_capture)."""
    config = InferenceConfig.model_validate({"return_routed_experts": True})
    gpu, cpu = vllm_command(config, on_cpu=False), vllm_command(config, on_cpu=True)
    assert "--enable-return-routed-experts" in gpu.args and gpu.env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert "--enable-prefix-caching" in gpu.args and CAPTURE_ROUTING_ENV not in gpu.env
    assert "--enable-return-routed-experts" not in cpu.args and "VLLM_USE_V2_MODEL_RUNNER" not in cpu.env
    assert "--enforce-eager" in cpu.args and "--no-enable-prefix-caching" in cpu.args
    assert cpu.env[CAPTURE_ROUTING_ENV] == "1"
    plain = vllm_command(InferenceConfig(), on_cpu=True)
    assert CAPTURE_ROUTING_ENV not in plain.env and "--enforce-eager" not in plain.args


def test_router_replay_asks_inference_for_routed_experts():
    from rlkube.config import RLConfig

    def served(**loss) -> bool:
        config = RLConfig.model_validate({"trainer": {"loss": loss}})
        return config.process_configs()["inference"].return_routed_experts

    assert served(router_replay=True) and not served()


def test_shm_spin_is_configurable_on_both():
    config = InferenceConfig.model_validate({"shm_spin_ms": 0.5})
    assert vllm_command(config, on_cpu=False).env[SPIN_ENV] == "0.5"
    assert vllm_command(config, on_cpu=True).env[SPIN_ENV] == "0.5"


def test_dry_run_prints_resolved_config(capsys, tmp_path):
    from rlkube.entrypoints.inference import main

    (tmp_path / "config.json").write_text("{}")
    assert main(["--model.name", str(tmp_path), "--port", "9000", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f'name = "{tmp_path}"' in out and "port = 9000" in out


def test_inference_process_refuses_a_taken_port(tmp_path):
    import socket

    import pytest
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
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    model = init_tiny_model(tmp_path / "model")
    path = model / "generation_config.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | {"top_k": 20, "top_p": 0.95}))

    def request_defaults(**extra_args) -> dict:
        config = InferenceConfig.model_validate({"model": {"name": str(model)}, "extra_args": extra_args})
        parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(vllm_command(config, on_cpu=True).args)
        return AsyncEngineArgs.from_cli_args(parsed).create_model_config().get_diff_sampling_param()

    assert request_defaults() == {}
    assert request_defaults(generation_config="auto") == {"top_k": 20, "top_p": 0.95}
