"""Publishing new policy weights from the trainer to inference: the publisher `weights.type` selects.

The trainer snapshots the full weights (gathered from FSDP into reused host buffers, in the
wire dtype: rlkube.trainer.publish), calls `publish(state_dict, step)` on rank 0 (in the
background while the next step computes), and reports the returned location to the
orchestrator, which tells each inference replica to load it
(`rlkube.inference.client.update_weights`).

- `storage`: an HF snapshot under `<url or output_dir/weights>/step_N/` (any fsspec URL);
- `grpc`: the snapshot is served from memory by rank 0's `Weights` gRPC server;
- `nixl`: each replica READs the weights out of rank 0's registered host memory
  (rlkube.transport.weights_nixl), told where by that same gRPC server;
- `nccl` (GPU): broadcast straight into the inference workers through vLLM's weight-transfer
  engine; the replicas are updated by the time `publish` returns.

`weights.delta` wraps `storage` or `grpc`: after a full snapshot, only the elements that changed
travel (rlkube.transport.weights_delta).

A LoRA run (`adapter_config` given) publishes its adapters alone as a PEFT directory through
`storage` or `grpc`; inference serves them as a vLLM LoRA adapter or merges them into its base
weights (`trainer.lora.serving`).
"""

from pathlib import Path

from rlkube.config import WeightTransferConfig
from rlkube.transport.weights import GrpcPublisher, StoragePublisher, WeightPublisher


def make_publisher(
    config: WeightTransferConfig, output_dir: str | Path, model_dir: str, adapter_config: dict | None = None,
    final_step: int | None = None,
) -> WeightPublisher:
    """The publisher `config.type` selects. `model_dir` supplies config.json and tokenizer;
    `adapter_config` (PEFT's, a LoRA run) makes every snapshot an adapter directory;
    `final_step`, the run's last step, is published whole with `config.delta`. Tensors are sent
    in the dtype they are given (the trainer's snapshot casts them to `config.dtype`)."""
    if adapter_config is not None and config.type in ("nccl", "nixl"):
        raise ValueError(f"weights.type: {config.type!r} sends full weights; a LoRA run (trainer.lora) publishes "
                         "its adapters through 'storage' or 'grpc'")
    if config.delta is not None and adapter_config is not None:
        raise ValueError("weights.delta: a LoRA run publishes its adapters, small already; unset it")
    publisher = _transport_publisher(config, output_dir, model_dir, adapter_config)
    if config.delta is None:
        return publisher
    from rlkube.transport.weights_delta import DeltaPublisher

    return DeltaPublisher(publisher, model_dir, config.delta.full_every, final_step)


def storage_root(config: WeightTransferConfig, output_dir: str | Path) -> str:
    """Where `weights.type = "storage"` writes its snapshots: `weights.url`, else `<output_dir>/weights`."""
    return config.url or str(Path(output_dir) / "weights")


def _transport_publisher(
    config: WeightTransferConfig, output_dir: str | Path, model_dir: str, adapter_config: dict | None
) -> WeightPublisher:
    if config.type == "storage":
        return StoragePublisher(storage_root(config, output_dir), model_dir, config.keep_last, adapter_config)
    if config.type == "grpc":
        return GrpcPublisher(
            config.grpc_host, config.grpc_port, model_dir, config.keep_last, bind_host=config.grpc_bind_host,
            adapter_config=adapter_config,
        )
    if config.type == "nixl":
        from rlkube.transport.weights_nixl import NixlPublisher

        return NixlPublisher(config.grpc_host, config.grpc_port, config.keep_last, config.nixl_transports,
                             bind_host=config.grpc_bind_host)
    from rlkube.transport.weights_nccl import NcclPublisher

    return NcclPublisher(config)
