"""rlkube's vLLM worker extension: load a published weight snapshot in place.

vLLM mixes this class into its worker (`--worker-extension-cls`), and the orchestrator reaches
it through vLLM's `/collective_rpc` route (see `rlkube.inference.client.update_weights`), so
every worker of a replica (all tensor-parallel ranks) loads the same snapshot.

A location is one of:
- a local directory `.../step_N` (a PVC);
- an fsspec URL `s3://bucket/run/weights/step_N`: downloaded to a temporary directory first;
- `grpc://host:port`: snapshot `step` pulled from the trainer's weight server into memory;
- `nixl://host:port`: snapshot `step` READ through NIXL out of the trainer's registered memory
  into a buffer this worker registered once and reuses (rlkube.transport.weights_nixl);
- `delta:<a storage or grpc location>` (`weights.delta`): the worker keeps the policy it serves and patches it
  with the elements that changed (rlkube.transport.weights_delta).

Either way, a snapshot not published yet is waited for up to `timeout` seconds.

A LoRA run's snapshot holds its adapters alone (PEFT layout, `adapter_config.json` present).
Served with `trainer.lora.serving = "merge"`, they come here and are merged,
`W = W_base + (alpha / r) * B @ A`, into the base weights of the modules they adapt, which the
worker reads once from the served model's own safetensors files and keeps; only those merged
tensors are reloaded. That keeps LoRA kernels off the decode path (on CPU, where vLLM's LoRA
layers also give up torch.compile, it serves about twice as fast), at the cost of a host copy
of every adapted base tensor per worker. With "adapter" (the default) they never reach this
extension: `rlkube.inference.lora_serving` loads them with vLLM's LoRA support.
"""

import contextlib
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from rlkube.inference.moe_reload import prepacked_on_reload
from rlkube.inference.routing_capture import RoutingCaptureExtension
from rlkube.models.hub import checkpoint_dir
from rlkube.models.lora_math import adapted_modules, merged_weights, scaling_of
from rlkube.transport.weights_delta import DELTA_SCHEME, ChainReader, PolicyReplica
from rlkube.transport.weights_grpc import fetch_snapshot
from rlkube.transport.weights_nixl import NIXL_SCHEME, NixlReceiver
from rlkube.transport.weights_snapshot import ADAPTER_CONFIG, ADAPTER_WEIGHTS, iter_safetensors
from rlkube.transport.weights_storage import local_snapshot

logger = logging.getLogger(__name__)

GRPC_SCHEME = "grpc://"

_RELOAD_LOGGERS = ("vllm.model_executor.model_loader.reload.inplace", "vllm.model_executor.model_loader.reload.layerwise")
"""vLLM's in-place reload, which warns about every layer a load leaves as it is."""


@contextlib.contextmanager
def _partial_reload_quietly() -> Iterator[None]:
    """An adapter reloads only the modules it changes, on purpose: without this, vLLM would
    warn at every update for each other layer and list every weight it kept."""
    loggers = [logging.getLogger(name) for name in _RELOAD_LOGGERS]
    levels = [each.level for each in loggers]
    for each in loggers:
        each.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for each, level in zip(loggers, levels, strict=True):
            each.setLevel(level)


def _repack_tied_head(model: torch.nn.Module) -> None:
    """A model with tied word embeddings computes its logits with the input embedding's tensor,
    but on CPU through a copy packed for oneDNN when its layer was last processed
    (`UnquantizedEmbeddingMethod.process_weights_after_loading`). vLLM's reload processes only
    the layers a snapshot names, and a snapshot written by `save_pretrained` leaves the tied
    `lm_head.weight` out: the embedding would change and the head keep computing with the
    previous policy's (measured on the tiny Qwen3-MoE: log-probs 1.9 nats off after loading the
    original weights back over an update). So the head is packed again after every load."""
    config = getattr(model, "config", None)
    head = getattr(model, "lm_head", None)
    if getattr(config, "tie_word_embeddings", False) and head is not None and hasattr(head, "quant_method"):
        head.quant_method.process_weights_after_loading(head)


class WeightLoaderExtension(RoutingCaptureExtension):
    """Methods added to vLLM's worker; `self` is the worker (it has `reload_weights`). With
    them, the capture of routed experts on CPU (rlkube.inference.routing_capture)."""

    def rlkube_load_weights(self, location: str, step: str = "-1", timeout: str = "600") -> str:
        """Load the snapshot at `location` into the running model. Arguments arrive as strings
        (vLLM's `/collective_rpc` only forwards strings). Returns a one-line summary."""
        start = time.perf_counter()
        self._remember_served_model()
        if location.startswith(DELTA_SCHEME):  # weights.delta: a replica keeps the policy it serves
            replica = self.__dict__.setdefault("_rlkube_policy", PolicyReplica())
            reader = ChainReader(location, float(timeout))
            self._reload(weights_iterator=iter(replica.update(reader.first(int(step)), reader.read).items()))
            size = None
        elif location.startswith(GRPC_SCHEME):
            files = fetch_snapshot(location.removeprefix(GRPC_SCHEME), int(step), float(timeout))
            fetched = time.perf_counter() - start
            if ADAPTER_CONFIG in files:
                self._load_adapter(files)
            else:
                self._reload(weights_iterator=iter_safetensors(files))
            size = sum(map(len, files.values()))
        elif location.startswith(NIXL_SCHEME):
            if not hasattr(self, "_rlkube_nixl"):
                self._rlkube_nixl = NixlReceiver()
            _, tensors = self._rlkube_nixl.receive(location.removeprefix(NIXL_SCHEME), int(step), float(timeout))
            fetched = time.perf_counter() - start
            self._reload(weights_iterator=iter(tensors.items()))
            size = sum(t.numel() * t.element_size() for t in tensors.values())
        else:
            with local_snapshot(location, float(timeout)) as path:
                if (Path(path) / ADAPTER_CONFIG).is_file():
                    self._load_adapter({name: (Path(path) / name).read_bytes() for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)})
                else:
                    self._reload(weights_path=path)
            size = None
        took = time.perf_counter() - start
        logger.info("loaded weights of step %s from %s in %.2fs", step, location, took)
        # the bytes, and how long receiving them took before the reload, where they come in whole
        return f"step {step} from {location} in {took:.3f}s" + (f" ({size} bytes, fetched in {fetched:.3f}s)" if size else "")

    def _reload(self, **weights) -> None:
        """vLLM's in-place `reload_weights`, MoE experts prepacked again for its CPU kernel
        (rlkube.inference.moe_reload), and a tied output head packed again."""
        model = self.model_runner.get_model()
        with prepacked_on_reload(model):
            self.reload_weights(**weights)
        _repack_tied_head(model)

    def _remember_served_model(self) -> None:
        """The model directory vLLM started with, taken before any load: a load from a path
        repoints `model_config.model` at that snapshot."""
        if not hasattr(self, "_rlkube_served_model"):
            self._rlkube_served_model = self.vllm_config.model_config.model

    def _load_adapter(self, files: dict[str, bytes | bytearray]) -> None:
        """Merge a PEFT adapter into the served model's own base weights and load the result."""
        config = json.loads(bytes(files[ADAPTER_CONFIG]))
        adapter = dict(iter_safetensors({ADAPTER_WEIGHTS: files[ADAPTER_WEIGHTS]}))
        base = self._lora_base_weights(tuple(adapted_modules(adapter)))
        merged = merged_weights(base, adapter, scaling_of(config))
        with _partial_reload_quietly():
            self._reload(weights_iterator=iter({**base, **merged}.items()))

    def _lora_base_weights(self, modules: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The served model's original tensors of the adapted `modules`, plus those fused with
        them inside vLLM (`qkv_proj`, `gate_up_proj`: a fused layer reloads only when all its
        parts arrive), read once from its safetensors files and kept. By the modules the
        adapter holds, not the names in its `target_modules`: an MoE's experts match those
        names in the checkpoint (`mlp.experts.3.gate_proj`) but are never adapted, and sending
        some of an expert layer's tensors (`gate_proj` without `down_proj`) made vLLM serve
        log-probs 1.3 nats off what the merged weights compute."""
        cached = getattr(self, "_rlkube_lora_base", None)
        if cached is not None and cached[0] == modules:
            return cached[1]
        from safetensors import safe_open

        fused = getattr(self.model_runner.get_model(), "packed_modules_mapping", {}).values()
        wanted = set(modules)
        for module in modules:
            parent, _, leaf = module.rpartition(".")
            wanted.update(f"{parent}.{part}" for parts in fused if leaf in parts for part in parts)
        tensors = {}
        for file in sorted(checkpoint_dir(self._rlkube_served_model).glob("*.safetensors")):
            with safe_open(file, "pt") as f:
                names = f.keys()
                tensors.update({key: f.get_tensor(key) for key in names if key.rpartition(".")[0] in wanted})
        self._rlkube_lora_base = (modules, tensors)
        return tensors
