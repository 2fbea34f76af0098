"""The weight publisher's interface, and the two transports that need no GPU.

- `StoragePublisher`: an HF snapshot under `<url or output_dir/weights>/step_N/` (any fsspec URL);
- `GrpcPublisher`: the snapshot is served from memory by rank 0's `Weights` gRPC server.

A publisher must not hold on to the tensors it is given once `publish` returns: they are
overwritten by the next snapshot (rlkube.trainer.publish reuses its host buffers).

The third, `NcclPublisher`, lives in rlkube.transport.weights_nccl (it needs vLLM and a GPU);
`make_publisher` (rlkube.transport.publishers) picks one by `weights.type`.
"""

from abc import ABC, abstractmethod

import torch

from rlkube.transport.weights_snapshot import Snapshot


class WeightPublisher(ABC):
    @abstractmethod
    def publish(self, state_dict: dict[str, torch.Tensor], step: int) -> str:
        """Make `state_dict` available as policy `step`; returns where inference finds it."""

    def republish(self, state_dict: dict[str, torch.Tensor], step: int) -> None:
        """Make policy `step` available again for a trainer resuming from its checkpoint (the
        orchestrator loads it from the location it saved, so nothing is returned)."""
        self.publish(state_dict, step)

    def published_bytes(self, state_dict: dict[str, torch.Tensor]) -> int:
        """The tensor bytes the newest `publish(state_dict, ...)` sent: all of them here; a
        delta publisher (rlkube.transport.weights_delta) sends fewer."""
        return sum(tensor.nbytes for tensor in state_dict.values())

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
        return self.publish_snapshot(Snapshot(state_dict, step, self.model_dir, adapter_config=self.adapter_config))

    def publish_snapshot(self, snapshot: Snapshot) -> str:
        """Write a prepared snapshot (a full one or a delta: rlkube.transport.weights_delta)."""
        from rlkube.transport.weights_storage import prune, write_snapshot

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
        return self.publish_snapshot(Snapshot(state_dict, step, self.model_dir, adapter_config=self.adapter_config))

    def publish_snapshot(self, snapshot: Snapshot) -> str:
        """Serve a prepared snapshot (a full one or a delta: rlkube.transport.weights_delta)."""
        self.servicer.add(snapshot.step, snapshot.files(self.servicer.buffer))
        return f"grpc://{self.address}"

    def expect(self, step):
        self.servicer.expect(step)

    def close(self):
        self.server.stop(grace=5).wait()
