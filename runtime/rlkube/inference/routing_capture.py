"""Routed experts on vLLM's CPU backend: captured by rlkube's worker extension.

vLLM 0.32 returns the experts each token was routed to (`--enable-return-routed-experts`) only
from its Model Runner V2, which needs Triton; on CPU that means a Triton with a CPU backend
(triton-cpu), which no package index publishes. So on CPU, `inference.return_routed_experts`
captures the routing in the worker with vLLM's own pieces, through the V1 runner:

- vLLM's `RoutedExpertsCapturer`, bound to every MoE router (`bind_routed_experts_capturer`),
  writes each forward's top-k expert ids into a `[tokens, layers, top_k]` buffer;
- after each `execute_model` the worker hands each scheduled request its rows (requests are
  laid out in the batch's order, `num_scheduled_tokens` each, from the position their chunk
  starts at), so a request's routing grows position by position, prompt first;
- the API server takes a finished request's routing with one `collective_rpc`
  (`rlkube_take_routing`) and answers it in vLLM's own format, a base64 `.npy` string of
  `[tokens - 1, layers, top_k]` (no forward follows the last sampled token), which
  `rlkube.inference.generate_mode` then gives to verifiers' client like vLLM's.

Two things differ from the GPU path, both set by `rlkube.inference.server.vllm_command`: the
model runs eagerly (the capture is bound after startup, and a graph compiled before would not
call it) and prefix caching is off (a cached prefix is not recomputed, so it has no routing).
Routing not taken within `KEPT_FINISHED` finished requests (an aborted or streamed request) is
dropped.
"""

import logging
from collections import OrderedDict

import numpy as np

logger = logging.getLogger(__name__)

TAKE_ROUTING = "rlkube_take_routing"
CAPTURE_ROUTING = "rlkube_capture_routing"
KEPT_FINISHED = 4096


class RequestRouting:
    """Each request's routing rows so far, from the capturer's buffer after each step."""

    def __init__(self, capturer):
        self.capturer = capturer
        self.rows: dict[str, np.ndarray | None] = {}
        """Request id -> [positions computed, layers, top_k]; None once a gap made it unusable."""
        self.finished: OrderedDict[str, None] = OrderedDict()

    def after_step(self, runner, scheduler_output) -> None:
        total = scheduler_output.total_num_scheduled_tokens
        if total:
            data = self.capturer.snapshot_routing_data(total).cpu().numpy()
            offset = 0
            for request_id in runner.input_batch.req_ids:
                count = scheduler_output.num_scheduled_tokens.get(request_id, 0)
                start = runner.requests[request_id].num_computed_tokens
                self._extend(request_id, start, data[offset : offset + count])
                offset += count
        for request_id in scheduler_output.finished_req_ids:
            self.finished[request_id] = None
        while len(self.finished) > KEPT_FINISHED:
            self.rows.pop(self.finished.popitem(last=False)[0], None)

    def _extend(self, request_id: str, start: int, rows: np.ndarray) -> None:
        """Rows for positions `start:`; a recomputation (preemption) overwrites what it redoes."""
        known = self.rows.get(request_id, np.empty((0, *rows.shape[1:]), rows.dtype))
        if known is None or start > len(known):  # positions never computed here: unusable
            self.rows[request_id] = None
            return
        self.rows[request_id] = np.concatenate([known[:start], rows])

    def take(self, request_id: str) -> np.ndarray | None:
        """The routing of the engine request made for the API request `request_id` (vLLM adds
        a random suffix to it), removed; None when there is none."""
        key = next((k for k in self.rows if k == request_id or k.startswith(request_id + "-")), None)
        if key is None:
            return None
        self.finished.pop(key, None)
        return self.rows.pop(key)


class RoutingCaptureExtension:
    """Methods added to vLLM's worker (through `WeightLoaderExtension`)."""

    def rlkube_capture_routing(self) -> str:
        """Bind the capture to the model's routers and start recording after every step."""
        if getattr(self, "_rlkube_routing", None) is not None:
            return "already capturing"
        from vllm.model_executor.layers.fused_moe.routed_experts_capturer import (
            RoutedExpertsCapturer,
            bind_routed_experts_capturer,
        )

        runner = self.model_runner
        capturer = RoutedExpertsCapturer(self.vllm_config.scheduler_config.max_num_batched_tokens, self.vllm_config)
        bind_routed_experts_capturer(runner.get_model(), capturer)
        routing = self._rlkube_routing = RequestRouting(capturer)
        execute_model = runner.execute_model

        def execute_and_record(scheduler_output, *args, **kwargs):
            output = execute_model(scheduler_output, *args, **kwargs)
            routing.after_step(runner, scheduler_output)
            return output

        runner.execute_model = execute_and_record
        logger.info("capturing routed experts: %d layers, top-%d", *capturer.shape_per_token)
        return "capturing"

    def rlkube_take_routing(self, request_id: str, start: int = 0) -> str | None:
        """The request's routing from position `start` on (its `routed_experts_prompt_start`),
        as vLLM's generate route would answer it (base64 `.npy`)."""
        from vllm.utils.serial_utils import numpy2base64

        rows = self._rlkube_routing.take(request_id)
        return None if rows is None else numpy2base64(rows[start:])
