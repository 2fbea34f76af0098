"""Run vLLM's OpenAI-compatible server from an `InferenceConfig`.

This is vLLM's own server (`vllm serve`), not a wrapper around a generate loop. rlkube turns on:
- vLLM's development/RL routes (`VLLM_SERVER_DEV_MODE=1`): `/pause`, `/resume`, `/is_paused`,
  `/collective_rpc`, `/reset_prefix_cache`, `/update_weight_version`, `/weight_info`, and the
  weight-transfer routes (`/init_weight_transfer_engine`, `/update_weights`, ...) the NCCL path
  uses;
- the token-in/token-out route `/inference/v1/generate` (`--enable-scale-out`), answering as
  verifiers' training client expects (`rlkube.inference.generate_mode`); with
  `inference.return_routed_experts`, with each token's routed experts (MoE models: vLLM's own
  capture on GPU, rlkube's on CPU, `rlkube.inference.routing_capture`);
- rlkube's worker extension (`rlkube.inference.worker.WeightLoaderExtension`), which loads
  published snapshots from storage or gRPC;
- with `inference.max_lora_rank`, vLLM's LoRA support and rlkube's route that loads a LoRA run's
  adapter in place (`rlkube.inference.lora_serving`);
- with `inference.start_paused` (the default), generation paused from the start
  (`rlkube.inference.start_paused`): the orchestrator syncs the server, then resumes it;
- on CPU, a 5 ms busy-wait on vLLM's shared-memory queues instead of 1 s
  (`inference.shm_spin_ms`, applied by rlkube's vLLM plugin, `rlkube.inference.vllm_plugin`).
- the run's token (`rlkube.auth.RequireToken`): with `RLKUBE_TOKEN` set, every route but
  `/health` and `/metrics` answers 401 without `Authorization: Bearer <token>`. vLLM's own
  `--api-key` guards only `/v1/*`, which would leave `/collective_rpc` (load any weights),
  `/pause` and rlkube's `/rlkube/*` open to anyone who reaches the port. Without the variable
  the server is open and logs a warning at start.
Health: `/health` answers 200 once the engine is up and 500 once it died (liveness and
readiness probes both use it). On SIGTERM the server stops its engine, then gives the requests
still open `HTTP_SHUTDOWN_GRACE_S` seconds to finish before it exits.

The mapping from config to vLLM arguments and environment is a pure function (`vllm_command`),
tested on the session's running engines and, for what they cannot show (a GPU engine), through
vLLM's own argument parser (tests/inference/test_server_args.py).
"""

import json
import os
from dataclasses import dataclass

from rlkube.config import InferenceConfig
from rlkube.inference.generate_mode import CAPTURE_ROUTING_ENV
from rlkube.inference.vllm_plugin import SPIN_ENV

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The adapter ranks vLLM 0.32 can be configured for (`--max-lora-rank`)."""

WORKER_EXTENSION = "rlkube.inference.worker.WeightLoaderExtension"
GENERATE_MIDDLEWARE = "rlkube.inference.generate_mode.GenerateForRenderers"
START_PAUSED_MIDDLEWARE = "rlkube.inference.start_paused.StartPaused"
LORA_MIDDLEWARE = "rlkube.inference.lora_serving.LoadLoraAdapter"
AUTH_MIDDLEWARE = "rlkube.auth.RequireToken"
"""Added last, so it runs first: no route, rlkube's own included, answers without the token."""
CPU_SHM_SPIN_MS = 5.0
HTTP_SHUTDOWN_GRACE_S = 5
"""Seconds uvicorn waits, once the engine stopped, for requests still open before it cancels
them and exits. Its default waits forever: a request the stopped engine will never answer (a
weight load from a trainer that died with the run) held the server up after SIGTERM until
someone SIGKILLed it, and after a killed `rlkube rl` nobody does."""


@dataclass(frozen=True)
class VLLMCommand:
    args: list[str]
    env: dict[str, str]


def _extra_arg(key: str, value) -> list[str]:
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    if isinstance(value, (dict, list)):
        return [flag, json.dumps(value)]
    return [flag, str(value)]


def vllm_command(config: InferenceConfig, on_cpu: bool) -> VLLMCommand:
    """vLLM server arguments and environment for `config` on a CPU or a GPU machine."""
    dtype = config.model.dtype
    if dtype == "auto":
        # fp32 on CPU so the trainer (fp32 on CPU) and the sampler agree numerically.
        dtype = "float32" if on_cpu else "bfloat16"
    captures_routing = config.return_routed_experts and on_cpu  # rlkube's capture: eager, no prefix cache
    args = [
        "--model", config.model.name,
        "--host", config.host,
        "--port", str(config.port),
        "--dtype", dtype,
        "--seed", str(config.seed),
        "--max-num-seqs", str(config.max_num_seqs),
        "--logprobs-mode", config.logprobs_mode,
        "--worker-extension-cls", WORKER_EXTENSION,
        "--enable-scale-out",
        # With these two, /inference/v1/generate names each logprob entry "token_id:N", which
        # verifiers' training client requires (see rlkube/inference/generate_mode.py).
        "--return-tokens-as-token-ids",
        "--middleware", GENERATE_MIDDLEWARE,
        "--disable-uvicorn-access-log",
        # vLLM would otherwise apply the model's generation_config.json sampling defaults (Qwen3:
        # top_k 20, top_p 0.95) to every request that leaves them unset: the sampled tokens and
        # their logprobs would come from a truncated distribution the trainer does not model.
        "--generation-config", "vllm",
        "--enable-prefix-caching" if config.enable_prefix_caching and not captures_routing else "--no-enable-prefix-caching",
    ]
    if config.start_paused:
        args += ["--middleware", START_PAUSED_MIDDLEWARE]
    if config.max_model_len is not None:
        args += ["--max-model-len", str(config.max_model_len)]
    if config.max_lora_rank is not None:
        # A solo run's one adapter, or a pool's one per member, each request naming its own
        # (rlkube.inference.lora_serving).
        rank = min(r for r in VLLM_LORA_RANKS if r >= config.max_lora_rank)
        args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(config.max_loras),
                 "--middleware", LORA_MIDDLEWARE]
    if config.return_routed_experts and not on_cpu:
        args.append("--enable-return-routed-experts")
    if config.enforce_eager or captures_routing:
        args.append("--enforce-eager")
    if config.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(config.tensor_parallel_size)]
    if config.model.trust_remote_code:
        args.append("--trust-remote-code")
    if not on_cpu:
        args += ["--gpu-memory-utilization", str(config.gpu_memory_utilization)]
        args += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    for key, value in config.extra_args.items():
        args += _extra_arg(key, value)
    args += ["--middleware", AUTH_MIDDLEWARE]
    env = {
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_LOGGING_LEVEL": config.log.level.upper(),
    }
    if config.return_routed_experts and not on_cpu:  # vLLM captures routing only in its Model Runner V2
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if captures_routing:
        env[CAPTURE_ROUTING_ENV] = "1"
    if on_cpu and config.kv_cache_space_gb is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(config.kv_cache_space_gb)
    spin_ms = CPU_SHM_SPIN_MS if config.shm_spin_ms is None and on_cpu else config.shm_spin_ms
    if spin_ms is not None:
        env[SPIN_ENV] = f"{spin_ms:g}"
    return VLLMCommand(args=args, env=env)


def serve(config: InferenceConfig) -> int:
    """Run the server in this process until it is stopped (SIGTERM/SIGINT)."""
    import torch

    # The environment must be in place before vLLM is imported (it reads some of it on import).
    command = vllm_command(config, on_cpu=not torch.cuda.is_available())
    os.environ.update(command.env)

    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    cli_env_setup()
    parser = make_arg_parser(FlexibleArgumentParser(prog="rlkube inference"))
    args = parser.parse_args(command.args)
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    uvloop.run(run_server(args, timeout_graceful_shutdown=HTTP_SHUTDOWN_GRACE_S))
    return 0
