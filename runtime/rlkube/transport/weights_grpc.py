"""Weight snapshots over gRPC (the proto's `Weights` service): no shared storage needed.

The trainer's rank 0 keeps the newest snapshots in memory and streams them file by file in
chunks; each inference replica pulls the step it was told to load. A Fetch needs the run's
token (`rlkube.auth`): the snapshot is the model.

A replica's load holds its engine (vLLM runs the worker's RPC on the engine's own loop), so a
Fetch must never wait on something that cannot come:
- the server waits only for a step this trainer will publish on its own, the checkpoint step it
  resumes from (`WeightsServicer.expect`); any other step it does not hold is refused at once.
  A replacement trainer (a gang restart) reached through the same Service name used to wait for
  the step its predecessor had published until the load's deadline (ten minutes) while it
  needed rollouts from that very engine to train it;
- the client gives up dialling a server that does not answer within `CONNECT_TIMEOUT_S`, and
  keepalive ends a call whose server vanished mid-stream (`rlkube.transport.keepalive`).
The orchestrator retries a refused or failed load (a resume's, and a restarted replica's sync).
"""

import json
import logging
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc

from rlkube import auth
from rlkube.scopes import WEIGHTS
from rlkube.transport import keepalive, rlkube_pb2, rlkube_pb2_grpc
from rlkube.transport.weights_snapshot import COMPLETE, bases_needed

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
_MAX_MESSAGE = CHUNK_BYTES + 1024 * 1024
CONNECT_TIMEOUT_S = 15.0
"""How long a fetch dials a weight server that does not answer: a trainer that is up answers at
once, and one that is gone or still starting is retried by the orchestrator instead, with the
engine free meanwhile."""
_SERVICE = rlkube_pb2.DESCRIPTOR.services_by_name["Weights"].full_name
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
]


_DATA_TAG = bytes([3 << 3 | 2])
"""WeightsChunk.data's key: field 3, length-delimited."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_chunks(step: int, files: dict[str, bytes | bytearray]) -> Iterator[bytes]:
    """A snapshot as the serialized `WeightsChunk` messages of a Fetch, in order, each made as
    it is sent: protobuf encodes the small fields, and `data` follows straight from a slice of
    the file (fields may come in any order), so a held snapshot is its files alone, not also a
    second, encoded copy of them."""
    for name, data in files.items():
        view = memoryview(data)
        for start in range(0, max(len(view), 1), CHUNK_BYTES):
            piece = view[start : start + CHUNK_BYTES]
            fields = rlkube_pb2.WeightsChunk(step=step, file=name, last_of_file=start + CHUNK_BYTES >= len(view))
            yield b"".join((fields.SerializeToString(), _DATA_TAG, _varint(len(piece)), piece))


class WeightsServicer:
    """Holds the newest `keep_last` snapshots and streams them. A dropped snapshot's buffers
    are handed to the next one (`buffer`) once no Fetch is still sending them."""

    def __init__(self, keep_last: int | None):
        self.keep_last = keep_last
        self._snapshots: dict[int, dict[str, bytes | bytearray]] = {}
        self._sending: dict[int, int] = {}  # id of a snapshot's files -> Fetches sending them
        self._spare: list[bytearray] = []
        self._bases: dict[int, int | None] = {}  # step -> the step its delta builds on
        self._expected: int | None = None
        self._added = threading.Condition()

    def expect(self, step: int) -> None:
        """Announce that `step` (the checkpoint this trainer resumes from) is about to be
        published: a Fetch of it waits for it instead of being refused."""
        with self._added:
            self._expected = step

    def buffer(self, size: int) -> bytearray:
        """`size` bytes for a file of the next snapshot: a dropped snapshot's buffer of that
        size, or a new one."""
        with self._added:
            for i, buffer in enumerate(self._spare):
                if len(buffer) == size:
                    return self._spare.pop(i)
        return bytearray(size)

    def add(self, step: int, files: dict[str, bytes | bytearray]) -> None:
        """Hold `files` as snapshot `step`; drop all but the newest `keep_last` (and those their
        deltas build on)."""
        with self._added:
            replaced = self._snapshots.get(step)
            self._snapshots[step] = files
            self._bases[step] = json.loads(bytes(files[COMPLETE])).get("base")
            if replaced is not None:
                self._release(replaced)
            if self.keep_last is not None:
                held = sorted(self._snapshots)
                needed = bases_needed(held[-self.keep_last :], self._bases.get)
                for old in held[: -self.keep_last]:
                    if old not in needed:
                        del self._bases[old]
                        self._release(self._snapshots.pop(old))
            self._added.notify_all()

    def discard(self, step: int) -> None:
        """Stop serving `step` (a transport about to reuse its memory)."""
        with self._added:
            self._bases.pop(step, None)
            if (files := self._snapshots.pop(step, None)) is not None:
                self._release(files)

    def _release(self, files: dict) -> None:
        """With the lock held: `files` are no longer served; their buffers become the spare
        ones (only the latest dropped snapshot's are kept) once no Fetch is sending them."""
        if not self._sending.get(id(files)) and all(held is not files for held in self._snapshots.values()):
            self._spare = [data for data in files.values() if isinstance(data, bytearray)]

    def steps(self) -> list[int]:
        with self._added:
            return sorted(self._snapshots)

    def _awaited(self, step: int) -> bool:
        """Whether a Fetch of `step` (-1: the newest) should wait: it is the expected step and
        not held yet."""
        if self._expected is None or self._expected in self._snapshots:
            return False
        return step in (-1, self._expected) and not (step == -1 and self._snapshots)

    def Fetch(self, request, context) -> Iterator[bytes]:
        # The expected step is waited for until the caller's deadline, less a grace period (a
        # quarter of it, 0.5-5 s: a loaded machine is slow to wake this thread and send), so
        # the caller gets NOT_FOUND with the steps held, not a bare timeout.
        remaining = context.time_remaining()
        wait = None if remaining is None else max(0.0, remaining - min(5.0, max(0.5, remaining / 4)))
        with self._added:
            self._added.wait_for(lambda: not self._awaited(request.step), timeout=wait)
            step = max(self._snapshots, default=-1) if request.step == -1 else request.step
            files = self._snapshots.get(step)
            expected = self._expected
            if files is not None:
                self._sending[id(files)] = self._sending.get(id(files), 0) + 1
        if files is None:
            resuming = "" if expected is None else f", resuming from {expected}"
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no weight snapshot for step {request.step} (held: {self.steps()}{resuming}); this trainer "
                "publishes a step only after training it",
            )
        try:
            yield from encode_chunks(step, files)
        finally:
            with self._added:
                self._sending[id(files)] -= 1
                if not self._sending[id(files)]:
                    del self._sending[id(files)]
                    self._release(files)


def serve_weights(servicer: WeightsServicer, bind: str) -> grpc.Server:
    """Start a gRPC server for `servicer` on `bind` ("host:port")."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=CHANNEL_OPTIONS + keepalive.SERVER,
                         interceptors=auth.server_interceptors("the weight server (Weights.Fetch)", ("Weights",), aio=False))
    fetch = grpc.unary_stream_rpc_method_handler(  # responses are sent as encoded
        servicer.Fetch, request_deserializer=rlkube_pb2.WeightsRequest.FromString, response_serializer=None
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Fetch": fetch}),))
    try:
        server.add_insecure_port(bind)  # grpcio raises RuntimeError when it cannot bind
    except RuntimeError:
        raise OSError(f"weights.grpc_bind_host/grpc_port: cannot bind the weight server to {bind}") from None
    server.start()
    logger.info("weight server listening on %s", bind)
    return server


def fetch_snapshot(address: str, step: int, timeout: float) -> dict[str, bytearray]:
    """Pull snapshot `step` (-1: newest) from the weight server at `address` ("host:port"),
    within `timeout` (the server's wait for a step it is republishing included).

    A server that does not answer within `CONNECT_TIMEOUT_S`, or goes away mid-call (its trainer
    stopped; keepalive notices within ~15 s even when its pod vanished without a reset), fails
    the fetch. It is not dialled again: its replacement is a new attempt, which publishes this
    step only after training it on rollouts from the very engine that would sit blocked in this
    load meanwhile. Each fetch dials afresh (a replacement trainer behind the same name has a
    new address), and closes its channel on another thread: closing a channel that waited for
    readiness takes ~0.2 s with grpcio 1.85 (its connectivity poll's slice), which every gRPC
    load paid once and every NIXL load twice (a descriptor fetch before and after its READ).
    Keeping channels between fetches instead made a load after a trainer's pod vanished wait on
    the dead connection until keepalive gave it up.

    The weights credential goes only to the run's own weight servers: another `address`
    raises PermissionError before any dial (`auth.check_weights_peer`)."""
    auth.check_weights_peer(address)
    channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS + keepalive.CLIENT)
    try:
        parts = _fetch(channel, address, step, timeout)
    finally:
        threading.Thread(target=channel.close, name="weights-channel-close", daemon=True).start()
    if COMPLETE not in parts:
        raise ConnectionError(f"grpc://{address} sent an incomplete snapshot for step {step}")
    # bytearrays: writable, so the worker's tensors are views of them, not copies
    return {name: bytearray().join(chunks) for name, chunks in parts.items()}


def _fetch(channel: grpc.Channel, address: str, step: int, timeout: float) -> dict[str, list[bytes]]:
    connect = min(timeout, CONNECT_TIMEOUT_S)
    try:
        grpc.channel_ready_future(channel).result(timeout=connect)
    except grpc.FutureTimeoutError:
        raise ConnectionError(f"fetching weights of step {step}: no weight server answered at grpc://{address} "
                              f"within {connect:g}s") from None
    parts: dict[str, list[bytes]] = {}
    try:
        request = rlkube_pb2.WeightsRequest(step=step)
        for chunk in rlkube_pb2_grpc.WeightsStub(channel).Fetch(request, timeout=timeout, metadata=auth.grpc_metadata(WEIGHTS)):
            parts.setdefault(chunk.file, []).append(chunk.data)
    except grpc.RpcError as e:
        raise ConnectionError(
            f"fetching weights of step {step} from grpc://{address} failed: {e.code().name}: {e.details()}"
        ) from None
    return parts
