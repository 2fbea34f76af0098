"""The trainer's side of the Rollouts service: fetch this rank's batch, report new policies.

Synchronous (the trainer is a plain torch loop). Calls that fail because the orchestrator is
not up yet or restarting (UNAVAILABLE) are retried with exponential backoff until the deadline;
every other error is raised at once, as `RolloutError` naming the call.

The client remembers the first orchestrator instance id it is answered with (see
`rlkube.transport.server`). An answer from another instance raises `OrchestratorRestarted`,
also when a retry reconnected: that orchestrator restarted from its checkpoint (or from step
0), so the batches this trainer expects will never come, and its steps since that checkpoint
are lost. The trainer exits, and the whole run restarts from its newest complete checkpoint.
"""

import logging
import time

import grpc

from rlkube import auth
from rlkube.scopes import ROLLOUTS
from rlkube.transport import keepalive
from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport import rlkube_pb2_grpc as pb_grpc
from rlkube.transport.channel import CHANNEL_OPTIONS
from rlkube.transport.microbatch import from_message
from rlkube.transport.server import INSTANCE_ID_KEY

logger = logging.getLogger(__name__)

RETRYABLE = (grpc.StatusCode.UNAVAILABLE,)


class RolloutError(RuntimeError):
    """A Rollouts call failed for good (or ran past its deadline)."""


class OrchestratorRestarted(RuntimeError):
    """The orchestrator answering is not the instance this client started with. Not a
    `RolloutError`: nothing may catch it and carry on; the trainer must exit."""


class RolloutClient:
    """`RolloutClient("host:port", timeout_s=...)`; use as a context manager or `close()` it."""

    def __init__(self, address: str, timeout_s: float = 3600.0, backoff_s: float = 0.2, max_backoff_s: float = 5.0,
                 credential: str | None = None, unavailable_s: float | None = None):
        self.address = address
        self.unavailable_s = unavailable_s
        """Give up on a call once the orchestrator has been UNAVAILABLE this long (None: until the
        call's deadline). A pool's trainer bounds it, so a member gone mid-fetch fails alone
        instead of holding the others' steps until the deadline."""
        self.credential = credential
        """The rollouts credential to present; None: this process's own (`rlkube.auth`). A
        pool's trainer presents each member's (`rlkube.scopes.member_scoped`)."""
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS + keepalive.CLIENT)
        self.stub = pb_grpc.RolloutsStub(self.channel)
        self.orchestrator_id: str | None = None
        """The instance id of the first answer; every later answer must carry the same."""

    def _check_instance(self, what: str, call: grpc.Call) -> None:
        """Raise `OrchestratorRestarted` if `call` was answered by another orchestrator."""
        answered_by = dict(call.initial_metadata() or ()).get(INSTANCE_ID_KEY)
        if answered_by is None:  # no answer at all (unreachable): nothing to compare
            return
        if self.orchestrator_id is None:
            self.orchestrator_id = answered_by
            logger.info("orchestrator at %s is instance %s", self.address, answered_by)
        elif answered_by != self.orchestrator_id:
            raise OrchestratorRestarted(
                f"{what} at {self.address}: answered by orchestrator instance {answered_by}, not "
                f"{self.orchestrator_id} as before: the orchestrator restarted, and its batches no "
                "longer follow this trainer's steps; restart the trainer from the newest complete "
                "checkpoint (on Kubernetes the operator restarts the whole run)"
            )

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        """The run's token, and the instance expected, so that another one refuses the request
        before acting on it."""
        expected = () if self.orchestrator_id is None else ((INSTANCE_ID_KEY, self.orchestrator_id),)
        token = auth.bearer_metadata(self.credential) if self.credential else auth.grpc_metadata(ROLLOUTS)
        return token + expected

    def _call(self, what: str, fn, timeout_s: float | None = None):
        """`fn(remaining_s)` until it succeeds, retrying UNAVAILABLE until the deadline. `fn`
        returns `(result, call)`; every answer's instance id is checked, errors' included."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        delay, unavailable_since = self.backoff_s, None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RolloutError(f"{what} at {self.address}: no answer within {timeout_s or self.timeout_s:g}s")
            try:
                result, call = fn(remaining)
            except grpc.RpcError as e:
                if isinstance(e, grpc.Call):  # an error answer carries the id too
                    self._check_instance(what, e)
                code = e.code()
                if code not in RETRYABLE:
                    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                        raise RolloutError(f"{what} at {self.address}: deadline exceeded") from None
                    raise RolloutError(f"{what} at {self.address}: {code.name}: {e.details()}") from None
                unavailable_since = unavailable_since or time.monotonic()
                if self.unavailable_s is not None and time.monotonic() - unavailable_since > self.unavailable_s:
                    raise RolloutError(f"{what} at {self.address}: unavailable for {self.unavailable_s:g}s") from None
                logger.info("%s: orchestrator unavailable (%s); retrying in %.1fs", what, e.details(), delay)
            else:
                self._check_instance(what, call)
                return result
            time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, self.max_backoff_s)

    def get_batch(self, step: int, rank: int, world_size: int, micro_batch_rows: int = 1) -> list[dict]:
        """This rank's micro-batches for `step` (blocks until the orchestrator has them).

        Each micro-batch is a dict: `input_ids`, `position_ids` (int64), `sample_ids` (int32,
        -1 on padding), `loss_mask` (bool), `advantages`, `inference_logprobs`, `temperatures`
        (float32), all `[rows, seq_len]` with at most `micro_batch_rows` rows; plus ints
        `global_loss_tokens` (loss tokens of the whole step across ranks), `step`, `index`, `count`. Every rank of a step
        receives the same number of micro-batches (padding rows have an all-false loss_mask)."""
        request = pb.GetBatchRequest(step=step, rank=rank, world_size=world_size, micro_batch_rows=micro_batch_rows)
        what = f"GetBatch(step={step}, rank={rank})"

        def fetch(remaining: float) -> tuple[list[dict], grpc.Call]:
            call = self.stub.GetBatch(request, timeout=remaining, metadata=self._metadata())
            # The id comes first, before the orchestrator waits for the batch: a restarted one
            # (which would never produce this step) is detected at once, not at the deadline.
            self._check_instance(what, call)
            batches = [from_message(m) for m in call]
            if not batches or len(batches) != batches[0]["count"]:
                raise RolloutError(f"{what}: stream ended early")
            return batches, call

        return self._call(what, fetch)

    def report_policy(self, step: int, location: str, timeout_s: float = 60.0) -> int:
        """Tell the orchestrator that policy `step` is published at `location`."""
        request = pb.PolicyReport(step=step, location=location)
        ack = self._call(
            f"ReportPolicy(step={step})", lambda t: self.stub.ReportPolicy.with_call(request, timeout=t, metadata=self._metadata()), timeout_s
        )
        return ack.accepted_step

    def status(self, timeout_s: float = 10.0) -> pb.Status:
        return self._call(
            "GetStatus", lambda t: self.stub.GetStatus.with_call(pb.StatusRequest(), timeout=t, metadata=self._metadata()), timeout_s
        )

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "RolloutClient":  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, *exc) -> None:
        self.close()
