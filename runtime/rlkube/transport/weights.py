"""Publishing new policy weights from the trainer to inference, selected by `weights.type`.

The trainer snapshots the full weights (gathered from FSDP into reused host buffers, in the
wire dtype: rlkube.trainer.publish), calls `publish(state_dict, step)` on rank 0 (in the
background while the next step computes), and reports the returned location to the
orchestrator, which tells each inference replica to load it
(`rlkube.inference.client.update_weights`). A publisher must not hold on to the tensors it is
given once `publish` returns: they are overwritten by the next snapshot.

- `storage`: an HF snapshot under `<url or output_dir/weights>/step_N/` (any fsspec URL);
- `grpc`: the snapshot is served from memory by rank 0's `Weights` gRPC server;
- `nccl` (GPU): broadcast straight into the inference workers through vLLM's weight-transfer
  engine; the replicas are updated by the time `publish` returns.

A LoRA run (`adapter_config` given) publishes its adapters alone as a PEFT directory through
`storage` or `grpc`; inference serves them as a vLLM LoRA adapter or merges them into its base
weights (`trainer.lora.serving`).
"""

from abc import ABC, abstractmethod
from pathlib import Path

import torch

from rlkube.config import WeightTransferConfig
from rlkube.transport.weights_snapshot import Snapshot


class WeightPublisher(ABC):
    @abstractmethod
    def publish(self, state_dict: dict[str, torch.Tensor], step: int) -> str:
        """Make `state_dict` available as policy `step`; returns where inference finds it."""

    def republish(self, state_dict: dict[str, torch.Tensor], step: int) -> None:
        """Make policy `step` available again for a trainer resuming from its checkpoint (the
        orchestrator loads it from the location it saved, so nothing is returned)."""
        self.publish(state_dict, step)

    def expect(self, step: int) -> None:
        """Policy `step` is about to be republished (the trainer resumes from its checkpoint):
        a transport that serves snapshots itself lets a replica asking for it wait for it."""

    def close(self) -> None:
        """Release servers and connections."""


class StoragePublisher(WeightPublisher):
    def __init__(self, root: str, model_dir: str, keep_last: int | None, adapter_config: dict | None = None):
        self.root, self.model_dir, self.keep_last = root, model_dir, keep_last
        self.adapter_config = adapter_config

    def publish(self, state_dict, step):
        from rlkube.transport.weights_storage import prune, write_snapshot

        snapshot = Snapshot(state_dict, step, self.model_dir, adapter_config=self.adapter_config)
        location = write_snapshot(self.root, snapshot)
        prune(self.root, self.keep_last)
        return location

    def republish(self, state_dict, step):
        """Snapshots after `step` are dropped; `step`'s own is written only if it is missing
        (pruned), since inference may be loading a complete one at this very moment."""
        from rlkube.transport.weights_storage import discard_after, list_steps

        discard_after(self.root, step)
        if not list_steps(self.root).get(step):
            self.publish(state_dict, step)


class GrpcPublisher(WeightPublisher):
    """Serves snapshots on `bind_host:port` (default `host`) and advertises `grpc://host:port`:
    in a pod the server binds every interface while inference dials a stable Service name."""

    def __init__(self, host: str, port: int, model_dir: str, keep_last: int | None, bind_host: str | None = None,
                 adapter_config: dict | None = None):
        from rlkube.transport.weights_grpc import WeightsServicer, serve_weights

        self.model_dir, self.adapter_config = model_dir, adapter_config
        self.address = f"{host}:{port}"
        self.servicer = WeightsServicer(keep_last)
        self.server = serve_weights(self.servicer, f"{bind_host or host}:{port}")

    def publish(self, state_dict, step):
        self.servicer.add(step, Snapshot(state_dict, step, self.model_dir, adapter_config=self.adapter_config).files())
        return f"grpc://{self.address}"

    def expect(self, step):
        self.servicer.expect(step)

    def close(self):
        self.server.stop(grace=5).wait()


def make_publisher(
    config: WeightTransferConfig, output_dir: str | Path, model_dir: str, adapter_config: dict | None = None
) -> WeightPublisher:
    """The publisher `config.type` selects. `model_dir` supplies config.json and tokenizer;
    `adapter_config` (PEFT's, a LoRA run) makes every snapshot an adapter directory. Tensors
    are sent in the dtype they are given (the trainer's snapshot casts them to `config.dtype`)."""
    if adapter_config is not None and config.type == "nccl":
        raise ValueError("weights.type: 'nccl' broadcasts full weights; a LoRA run (trainer.lora) publishes "
                         "its adapters through 'storage' or 'grpc'")
    return _transport_publisher(config, output_dir, model_dir, adapter_config)


def _transport_publisher(
    config: WeightTransferConfig, output_dir: str | Path, model_dir: str, adapter_config: dict | None
) -> WeightPublisher:
    if config.type == "storage":
        root = config.url or str(Path(output_dir) / "weights")
        return StoragePublisher(root, model_dir, config.keep_last, adapter_config)
    if config.type == "grpc":
        return GrpcPublisher(
            config.grpc_host, config.grpc_port, model_dir, config.keep_last, bind_host=config.grpc_bind_host,
            adapter_config=adapter_config,
        )
    from rlkube.transport.weights_nccl import NcclPublisher

    return NcclPublisher(config)
