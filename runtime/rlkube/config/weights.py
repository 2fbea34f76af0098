"""How new policy weights travel from the trainer to inference."""

from typing import Literal

from pydantic import Field

from rlkube.config.base import Config


class DeltaConfig(Config):
    """Delta updates (`weights.delta`): after a full snapshot, each policy travels as the wire-dtype
    elements that changed since the one before (rlkube.transport.weights_delta)."""

    full_every: int = Field(default=10, ge=1)
    """A full snapshot at least every this many publishes: bounds what a replica that joins,
    restarts or missed updates fetches (one full snapshot, then the deltas after it)."""


class WeightTransferConfig(Config):
    type: Literal["storage", "grpc", "nixl", "nccl"] = "storage"
    """`storage`: the trainer writes an HF safetensors snapshot to `url` and each replica loads it;
    `grpc`: each replica pulls the snapshot from the trainer's gRPC server (no shared storage);
    `nixl`: each replica READs the weights out of the trainer's registered memory through NIXL
    (UCX: TCP or RDMA, `nixl_transports`), told where by the trainer's gRPC server;
    `nccl`: GPU broadcast through vLLM's weight-transfer engine."""

    url: str | None = None
    """`storage`: a path or fsspec URL (`s3://bucket/run/weights`); `<output_dir>/weights` when unset."""

    grpc_host: str = "127.0.0.1"
    """The trainer's rank 0 as inference dials it (on Kubernetes, the run's stable trainer
    master Service). `grpc`, `nixl`: the weight server's address, advertised in every policy
    location (`grpc://<grpc_host>:<grpc_port>`, `nixl://<grpc_host>:<grpc_port>`); `nccl`: the NCCL
    rendezvous address."""

    grpc_bind_host: str | None = None
    """`grpc`, `nixl`: the address the trainer's weight server binds (`0.0.0.0`: every interface, as in
    a pod, where `grpc_host` names a Service and not a local address); `grpc_host` when unset."""

    grpc_port: int = Field(default=50052, ge=1, le=65535)
    """`grpc`, `nixl`: port of the trainer's weight server."""

    nixl_transports: list[str] = Field(default=["tcp"], min_length=1)
    """`nixl`: the UCX transports both sides may use (`UCX_TLS`), e.g. `["rc", "cuda_copy"]` on
    an InfiniBand cluster. Name them: UCX's defaults failed between two hosts without RDMA."""

    nccl_port: int = Field(default=29600, ge=1, le=65535)
    """`nccl`: port of the NCCL rendezvous (a TCP store on the trainer's rank 0)."""

    inference_urls: list[str] = []
    """`nccl`: base URLs of the inference replicas the trainer broadcasts to (the trainer drives
    their weight-transfer routes itself)."""

    keep_last: int | None = Field(default=2, ge=1)
    """Snapshots to keep (older ones are deleted once inference moved past them); None keeps all."""

    timeout_s: float = Field(default=600, gt=0)
    """How long a weight update may take before it is an error."""

    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """The dtype weights travel in. `auto`: bfloat16 when the trainer computes in bfloat16
    (`model.dtype`; `auto` there is bfloat16 on GPUs), else float32, so an engine computing in
    bfloat16 gets half the bytes and the weights it would round to anyway. `float32` sends the
    trainer's float32 master weights (an engine computing in float32 then samples from exactly
    the trainer's weights); `bfloat16` halves every update."""

    delta: DeltaConfig | None = None
    """`storage` and `grpc`: publish only the elements that changed (bit-exact on the replicas;
    at RL learning rates in bfloat16 a few percent of them change per step); a delta that would
    take half a full snapshot's bytes or more goes as the full snapshot. Off when unset."""

    overlap: bool = True
    """Publish policy N in the background while step N+1 computes: after the optimizer step the
    weights are copied into host buffers reused from step to step (pinned, on a side CUDA
    stream, on GPUs), and a background thread writes or serves them and reports the policy to
    the orchestrator; at most one publish is in flight. `false` publishes before the next step
    starts (to compare, or to debug a transport)."""
