"""Publishing policy N off the critical path: a snapshot into reused host buffers, then the
write (storage), serving (gRPC) or broadcast (NCCL) and the `ReportPolicy(N)` on a background
thread while step N+1 computes.

The snapshot is the only part the training loop waits for. Every rank takes part (gathering a
sharded parameter is a collective, in the wire dtype); rank 0 copies each full tensor into a
host buffer allocated at the first publish and reused at every later one: fresh host
memory is paged in at ~1 GB/s where a reused buffer takes a copy at several GB/s. On CUDA the
buffers are pinned and the device-to-host copies run on a side stream, bucket by bucket: the
training loop waits only for the copies of all but the last bucket (which bounds the device
memory the gathered tensors hold), the background thread for the last one. Every copy reads a
tensor of its own (the cast, or a clone), never a parameter, so step N+1's optimizer may
change the parameters at once: the snapshot stays exactly policy N.

At most one publish is in flight: the next snapshot first waits for the previous publish,
since it overwrites the same buffers. A background failure is raised by that wait (or by
`wait()`/`close()`), in the training loop.
"""

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

BUCKET_BYTES = 256 * 1024**2
"""CUDA: device-to-host copies are awaited per bucket of this many bytes (double-buffered)."""


def wire_dtype(name: str, compute_dtype: torch.dtype) -> torch.dtype:
    """`weights.dtype` as a torch dtype: `auto` is bfloat16 when the trainer computes in
    bfloat16, float32 otherwise."""
    if name == "auto":
        return torch.bfloat16 if compute_dtype == torch.bfloat16 else torch.float32
    return getattr(torch, name)


class HostSnapshot:
    """Host buffers, one per tensor, holding the latest snapshot on rank 0 (`is_main`)."""

    def __init__(self, dtype: torch.dtype, is_main: bool, bucket_bytes: int = BUCKET_BYTES):
        self.dtype, self.is_main, self.bucket_bytes = dtype, is_main, bucket_bytes
        self.buffers: dict[str, torch.Tensor] = {}
        self._stream: torch.cuda.Stream | None = None
        self._copied: torch.cuda.Event | None = None

    def _buffer(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """Floating-point tensors travel in the wire dtype, others (integer buffers) as they are."""
        dtype = self.dtype if tensor.is_floating_point() else tensor.dtype
        buffer = self.buffers.get(name)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != dtype:
            buffer = torch.empty(tensor.shape, dtype=dtype, pin_memory=tensor.is_cuda)
            self.buffers[name] = buffer
        return buffer

    def capture(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Collective: copy `state_dict` (sharded DTensors or plain tensors, on every rank)
        into the buffers. On CUDA the last bucket's copies may still be running on return:
        `wait_copied()` before reading the buffers."""
        pending: list[torch.cuda.Event] = []
        bucket = 0
        for name, tensor in state_dict.items():
            full = _gathered(tensor, self.dtype).detach()
            if not self.is_main:
                continue
            buffer = self._buffer(name, full)
            if not full.is_cuda:
                buffer.copy_(full)
                continue
            bucket += self._copy_async(full, buffer)
            if bucket >= self.bucket_bytes:
                pending.append(self._stream.record_event())
                if len(pending) > 1:
                    pending.pop(0).synchronize()
                bucket = 0
        if self._stream is not None and self.is_main:
            self._copied = self._stream.record_event()

    def _copy_async(self, full: torch.Tensor, buffer: torch.Tensor) -> int:
        """Enqueue the copy of `full` into pinned `buffer` on the side stream, from a tensor of
        its own (never a parameter that the next optimizer step changes); its bytes."""
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=full.device)
        source = full.to(buffer.dtype, copy=True)
        self._stream.wait_stream(torch.cuda.current_stream(full.device))
        with torch.cuda.stream(self._stream):
            buffer.copy_(source, non_blocking=True)
        source.record_stream(self._stream)  # its memory is reused only once the copy is done
        return source.numel() * source.element_size()

    def wait_copied(self) -> None:
        """Block until every copy of the last capture has landed in the host buffers."""
        if self._copied is not None:
            self._copied.synchronize()
            self._copied = None


def _gathered(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The whole of `tensor` (collective for a sharded one), floating point in the wire dtype:
    each rank casts its shard before the all-gather, so a bfloat16 wire gathers half the bytes
    of float32 (casting commutes with gathering: the same values)."""
    if not isinstance(tensor, DTensor):
        return tensor
    return (tensor.to(dtype) if tensor.is_floating_point() else tensor).full_tensor()


class PolicyPublishing:
    """Publishes each policy through `publisher` and reports it through `client` (rank 0),
    in the background when `overlap`; every rank calls `publish`/`republish` (collectives).

    `publisher.publish` must not keep references to the tensors it is given once it returns:
    they are the reused host buffers."""

    def __init__(self, publisher, client, dtype: torch.dtype, is_main: bool, overlap: bool = True, barrier=None):
        self.publisher, self.client, self.is_main, self.overlap = publisher, client, is_main, overlap
        self.snapshot = HostSnapshot(dtype, is_main)
        self.barrier = barrier or (lambda: None)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="publish") if overlap and is_main else None
        self._in_flight: Future | None = None
        self.last_publish_s: float | None = None
        """Seconds the newest finished publish took after its snapshot (write + report)."""
        self.last_publish_bytes: int | None = None
        """Tensor bytes the newest finished publish sent (a delta's, or the full snapshot's)."""

    def publish(self, step: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Publish policy `step` and report it to the orchestrator: taken now, sent in the
        background (overlap) or before returning."""
        self.wait()
        self.snapshot.capture(state_dict)
        if not self.overlap:
            if self.is_main:
                self._publish_and_report(step)
            self.barrier()
        elif self.is_main:
            self._in_flight = self._executor.submit(self._publish_and_report, step)

    def expect(self, step: int) -> None:
        """Policy `step` will be republished (`republish`) once its checkpoint is loaded."""
        if self.is_main:
            self.publisher.expect(step)

    def republish(self, step: int, state_dict: dict[str, torch.Tensor]) -> None:
        """Make resumed policy `step` available again (not reported: the orchestrator restores
        its own policy step), before returning."""
        self.wait()
        self.snapshot.capture(state_dict)
        if self.is_main:
            self.snapshot.wait_copied()
            self.publisher.republish(self.snapshot.buffers, step)
        self.barrier()

    def _publish_and_report(self, step: int) -> None:
        start = time.perf_counter()
        self.snapshot.wait_copied()
        location = self.publisher.publish(self.snapshot.buffers, step)
        self.last_publish_bytes = self.publisher.published_bytes(self.snapshot.buffers)
        self.client.report_policy(step, location)
        self.last_publish_s = time.perf_counter() - start

    def wait(self) -> None:
        """Until the publish in flight (if any) is done; raises its error."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def close(self) -> None:
        """Finish the publish in flight (raising its error) and stop the background thread."""
        try:
            self.wait()
        finally:
            if self._executor is not None:
                self._executor.shutdown()
