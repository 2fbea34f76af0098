"""The trainer's side of the Rollouts service: fetch this rank's batch, report new policies.

Synchronous (the trainer is a plain torch loop). Calls that fail because the orchestrator is
not up yet or restarting (UNAVAILABLE) are retried with exponential backoff until the deadline;
every other error is raised at once, as `RolloutError` naming the call.
"""

import logging
import time

import grpc

from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.microbatch import from_message
from rlkube.transport.server import CHANNEL_OPTIONS

logger = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class RolloutError(RuntimeError):
    """A Rollouts call failed for good (or ran past its deadline)."""


class RolloutClient:
    """`RolloutClient("host:port", timeout_s=...)`; use as a context manager or `close()` it."""

    def __init__(self, address: str, timeout_s: float = 3600.0, backoff_s: float = 0.2, max_backoff_s: float = 5.0):
        self.address = address
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self.stub = pb_grpc.RolloutsStub(self.channel)

    def _call(self, what: str, fn, timeout_s: float | None = None):
        """`fn(remaining_s)` until it succeeds, retrying UNAVAILABLE until the deadline."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        delay = self.backoff_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RolloutError(f"{what} at {self.address}: no answer within {timeout_s or self.timeout_s:g}s")
            try:
                return fn(remaining)
            except grpc.RpcError as e:
                code = e.code()
                if code not in RETRYABLE:
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise RolloutError(f"{what} at {self.address}: deadline exceeded") from None
                    raise RolloutError(f"{what} at {self.address}: {code.name}: {e.details()}") from None
                logger.info("%s: orchestrator unavailable (%s); retrying in %.1fs", what, e.details(), delay)
            time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, self.max_backoff_s)

    def get_batch(self, step: int, rank: int, world_size: int, micro_batch_rows: int = 1) -> list[dict]:
        """This rank's micro-batches for `step` (blocks until the orchestrator has them).

        Each micro-batch is a dict: `input_ids`, `position_ids` (int64), `sample_ids` (int32,
        -1 on padding), `loss_mask` (bool), `advantages`, `inference_logprobs`, `temperatures`
        (float32), all `[micro_batch_rows, seq_len]`; plus ints `global_loss_tokens` (loss
        tokens of the whole step across ranks), `step`, `index`, `count`. Every rank of a step
        receives the same number of micro-batches (padding rows have an all-false loss_mask)."""
        request = pb.GetBatchRequest(step=step, rank=rank, world_size=world_size, micro_batch_rows=micro_batch_rows)

        def fetch(remaining: float) -> list[dict]:
            batches = [from_message(m) for m in self.stub.GetBatch(request, timeout=remaining)]
            if not batches or len(batches) != batches[0]["count"]:
                raise RolloutError(f"GetBatch(step={step}, rank={rank}): stream ended early")
            return batches

        return self._call(f"GetBatch(step={step}, rank={rank})", fetch)

    def report_policy(self, step: int, location: str, timeout_s: float = 60.0) -> int:
        """Tell the orchestrator that policy `step` is published at `location`."""
        request = pb.PolicyReport(step=step, location=location)
        ack = self._call(f"ReportPolicy(step={step})", lambda t: self.stub.ReportPolicy(request, timeout=t), timeout_s)
        return ack.accepted_step

    def status(self, timeout_s: float = 10.0) -> pb.Status:
        return self._call("GetStatus", lambda t: self.stub.GetStatus(pb.StatusRequest(), timeout=t), timeout_s)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "RolloutClient":  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, *exc) -> None:
        self.close()
