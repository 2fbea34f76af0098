"""`weights.type = "nccl"` (GPU): broadcast the weights straight into the inference workers
through vLLM's weight-transfer engine, with no disk and no copy through the host network stack.

The trainer's rank 0 is NCCL rank 0; the workers of replica i take the ranks after those of
replica i-1. The trainer drives every replica itself, in the order the storage and gRPC paths
follow (`rlkube.orchestrator.inference.InferencePool.load_policy`): `/pause` (in-flight
requests are kept, frozen) -> vLLM's `/start_weight_update`, `/update_weights` with the
broadcast, `/finish_weight_update` -> `/reset_prefix_cache` (its KV came from the old weights)
-> `/update_weight_version` -> `/resume`. No decode step runs on half-loaded layers, and by the
time `publish` returns every replica serves the new policy; the returned `nccl://` location
tells the orchestrator so, which then only waits to see that version served.
"""

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from rlkube import auth
from rlkube.config import WeightTransferConfig
from rlkube.scopes import WEIGHTS
from rlkube.transport.weights import WeightPublisher


def _authorized_sync_client(base_url: str, timeout: float):
    """vLLM's HTTP weight-sync client, sending the run's weights credential (`rlkube.auth`) with each request:
    its `_post` sends no headers. Should vLLM rename `_post`, the routes answer 401: loud, not silent."""
    import requests
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

    class AuthorizedSyncClient(HTTPVLLMWeightSyncClient):
        def _post(self, path: str, json: dict[str, Any] | None = None) -> None:
            url = f"{self.base_url}/{path}"
            requests.post(url, json=json, timeout=self.timeout, headers=auth.http_headers(WEIGHTS)).raise_for_status()

    return AuthorizedSyncClient(base_url, timeout)


class _ReplicasClient:
    """vLLM's HTTP weight-sync client fanned out over several replicas, plus rlkube's calls
    around a transfer."""

    def __init__(self, base_urls: list[str], world_sizes: list[int], timeout: float):
        self.base_urls, self.timeout = base_urls, timeout
        self.clients = [_authorized_sync_client(url, timeout) for url in base_urls]
        self.rank_offsets = [1 + sum(world_sizes[:i]) for i in range(len(base_urls))]

    def _each(self, call) -> None:
        with ThreadPoolExecutor(len(self.clients)) as pool:
            list(pool.map(call, range(len(self.clients))))

    def post(self, route: str, **kwargs) -> None:
        """POST `route` to every replica at once; raises on any failure."""
        import httpx

        def one(i: int) -> None:
            url = self.base_urls[i].rstrip("/") + route
            httpx.post(url, timeout=self.timeout, headers=auth.http_headers(WEIGHTS), **kwargs).raise_for_status()

        self._each(one)

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._each(lambda i: self.clients[i].init_weight_transfer_engine(
            {**init_info, "rank_offset": self.rank_offsets[i]}
        ))

    def start_weight_update(self) -> None:
        self._each(lambda i: self.clients[i].start_weight_update())

    def update_weights(self, update_info) -> None:
        self._each(lambda i: self.clients[i].update_weights(update_info))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._each(lambda i: self.clients[i].finish_weight_update(weight_version))


def _world_size(base_url: str, timeout: float) -> int:
    import httpx

    response = httpx.get(f"{base_url.rstrip('/')}/get_world_size", params={"include_dp": "false"}, timeout=timeout,
                         headers=auth.http_headers(WEIGHTS))
    response.raise_for_status()
    return int(response.json()["world_size"])


def current_state_dict(publisher):
    """vLLM's weight source over `publisher.state_dict`, the snapshot being published: its
    `metadata()` is the names, dtypes and shapes the workers are told to receive, each name then
    going through the served model's `load_weights` as a storage or gRPC snapshot's does."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class CurrentStateDict(WeightSource):
        def metadata(self):
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in publisher.state_dict.items()]

        def __iter__(self):
            device = torch.device("cuda", torch.cuda.current_device())
            for name, tensor in publisher.state_dict.items():
                yield name, tensor.to(device, non_blocking=True)

    return CurrentStateDict()


class NcclPublisher(WeightPublisher):
    def __init__(self, config: WeightTransferConfig):
        if not config.inference_urls:
            raise ValueError("weights.inference_urls: the nccl transport needs the inference replicas' URLs")
        if not torch.cuda.is_available():
            raise ValueError("weights.type: 'nccl' needs CUDA GPUs; use 'storage' or 'grpc' on CPU")
        self.config = config
        self.state_dict: dict[str, torch.Tensor] = {}
        self.replicas: _ReplicasClient | None = None
        self.engine = None

    def _connect(self):
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        urls, timeout = self.config.inference_urls, self.config.timeout_s
        world_sizes = [_world_size(url, timeout) for url in urls]
        self.replicas = _ReplicasClient(urls, world_sizes, timeout)
        init_info = NCCLTrainerInitInfo(
            rank=0, master_address=self.config.grpc_host, master_port=self.config.nccl_port,
            world_size=1 + sum(world_sizes),
        )
        return NCCLTrainerWeightTransferEngine.trainer_init(init_info, client=self.replicas, source=current_state_dict(self))

    def publish(self, state_dict, step):
        """Pause, transfer, reset the prefix cache, tag version `step`, resume: each on every
        replica before the next. A failure leaves the replicas paused on purpose: their weights
        may be half-loaded, and the trainer's error ends the attempt."""
        self.state_dict = state_dict
        if self.engine is None:
            self.engine = self._connect()
        self.replicas.post("/pause", params={"mode": "keep"})
        self.engine.send_weights()
        self.replicas.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
        self.replicas.post("/update_weight_version", json={"new_version": str(step)})
        self.replicas.post("/resume")
        self.state_dict = {}
        return f"nccl://{self.config.grpc_host}:{self.config.nccl_port}"

    def close(self):
        if self.engine is not None:
            self.engine.shutdown()
