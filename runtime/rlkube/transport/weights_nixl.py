"""Weight snapshots over NIXL (`weights.type = "nixl"`): each replica READs the policy straight
out of the trainer's registered host memory, through UCX (TCP here, RDMA on a cluster that has
it), with no serialization on either side.

- The trainer's rank 0 packs each snapshot into one contiguous host buffer, registered with its
  NIXL agent once and reused: `keep_last` of them, taken in turn (`NixlPublisher`). The copy
  into it runs at memory speed; the trainer's own host buffers are overwritten by its next
  snapshot while replicas may still be reading, so they cannot be the ones read.
- What a replica needs to read (the agent's metadata, the buffer's address, each tensor's
  dtype, shape and offset, the UCX transports) is a small JSON descriptor served as the only
  file of a "snapshot" by the trainer's `Weights` gRPC server, so it travels on the run's
  authenticated channel, with the gRPC path's waiting and refusal rules (rlkube.transport.
  weights_grpc). The location the orchestrator hands inference is `nixl://host:port`.
- The replica (`NixlReceiver`, one per inference worker) READs into one buffer it registered
  and reuses, then loads views of it in place, as the gRPC path does. It asks for the
  descriptor again afterwards: a buffer is rewritten only after its step has left the server,
  so the same descriptor (same generation) proves that nothing overwrote what was read.

Neither side runs NIXL's progress thread: it polled UCX without sleeping, a third of a core on
an idle trainer here and all of one in an inference worker whose trainer had gone (it stayed so
for the engine's lifetime). The reader progresses its READ by polling its state; the trainer,
whose side of a TCP read must answer it, is progressed by `_Progress`, often only while a
replica has lately asked where to read.

UCX's own endpoint does not check the run's token; only the authenticated descriptor tells a
reader where the memory is, and the run's NetworkPolicy admits only the run's own pods.
UCX's default transports fail between two hosts without RDMA (NIXL_ERR_BACKEND), so they are
named (`weights.nixl_transports`, set as `UCX_TLS` on both sides).
"""

import json
import logging
import os
import threading
import time
import uuid

import torch

from rlkube.transport.weights import WeightPublisher
from rlkube.transport.weights_grpc import WeightsServicer, fetch_snapshot, serve_weights
from rlkube.transport.weights_snapshot import COMPLETE

logger = logging.getLogger(__name__)

NIXL_SCHEME = "nixl://"
DESCRIPTOR = "nixl.json"
"""The one file of a NIXL snapshot on the weight server: where and how to read the policy."""
_ALIGN = 64
TCP_SEGMENT = "512k"
"""UCX's TCP transport has no remote read: it emulates one, the trainer's side answering in
segments of `UCX_TCP_TX_SEG_SIZE`. At 512 KiB instead of UCX's 8 KiB a 0.5 GB READ between two
network namespaces here ran at 0.27-0.42 GB/s against 0.14-0.19 (both cores loaded by others).
An explicit `UCX_TCP_*_SEG_SIZE` in the environment wins."""
READ_BYTES = 64 * 1024**2
"""A READ is posted as pieces of this size, which UCX keeps in flight together."""
_POLL_S = 0.0005
PROGRESS_BUSY_S = 0.0002
"""The trainer's UCX progress interval while replicas may be reading: a 0.5 GB READ ran at 0.62
GB/s with 0.1 ms, 0.49 with 1 ms, 0.20-0.26 under NIXL's own progress thread (both cores loaded
by other work). Idle, 1 ms of it costs 3% of a core, 0.1 ms 11%, NIXL's thread 33%."""
PROGRESS_IDLE_S = 0.05
READING_S = 60.0
"""How long after a replica fetched a descriptor the trainer progresses UCX at the busy
interval: its READ follows the fetch (a GB at 0.2 GB/s takes 5 s)."""


def make_agent(role: str, transports: list[str]):
    """A NIXL agent with the UCX backend limited to `transports` (UCX reads `UCX_TLS` when the
    backend starts, so it is set for this process first)."""
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t
    except ImportError as e:
        raise ImportError(f"weights.type 'nixl' needs the nixl-cu12 package (rlkube[cpu] installs it): {e}") from None
    os.environ["UCX_TLS"] = ",".join(transports)
    if "tcp" in transports:
        for side in ("TX", "RX"):
            os.environ.setdefault(f"UCX_TCP_{side}_SEG_SIZE", TCP_SEGMENT)
    logging.getLogger("nixl").setLevel(logging.WARNING)  # else a line on stdout per agent and backend
    config = nixl_agent_config(enable_prog_thread=False, backends=["UCX"],
                               sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT)
    agent = nixl_agent(f"rlkube-{role}-{uuid.uuid4().hex[:12]}", config)
    if "UCX" not in agent.backends:
        raise RuntimeError("NIXL has no UCX backend here: its plugin did not load")
    return agent


def layout(state_dict: dict[str, torch.Tensor]) -> tuple[list[dict], int]:
    """Where each tensor lies in one packed buffer (offsets aligned for any dtype), and its size."""
    entries, offset = [], 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        entries.append({"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                        "offset": offset, "bytes": nbytes})
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return entries, offset


def unpacked(buffer: torch.Tensor, entries: list[dict]) -> dict[str, torch.Tensor]:
    """The tensors of a packed uint8 `buffer`, as views of it."""
    return {
        e["name"]: buffer[e["offset"] : e["offset"] + e["bytes"]].view(getattr(torch, e["dtype"])).view(e["shape"])
        for e in entries
    }


class _Registered:
    """A host buffer of `nbytes` registered with `agent`, kept until it is too small."""

    def __init__(self, agent, nbytes: int):
        self.agent = agent
        self.tensor = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        self.registration = agent.register_memory(self.tensor)

    def release(self) -> None:
        self.agent.deregister_memory(self.registration)


class _Slot:
    """One packed snapshot of the publisher's ring: its buffer, the step it holds and its
    layout."""

    def __init__(self):
        self.buffer: _Registered | None = None
        self.step: int | None = None


class _DescriptorServicer(WeightsServicer):
    """The weight server of NIXL descriptors, noting when a replica last asked where to read."""

    def __init__(self, keep_last: int | None):
        super().__init__(keep_last)
        self.last_fetch = float("-inf")

    def Fetch(self, request, context):
        self.last_fetch = time.monotonic()
        yield from super().Fetch(request, context)


class _Progress(threading.Thread):
    """Progresses the trainer agent's UCX worker (`get_new_notifs` does, without NIXL's
    progress thread): every `PROGRESS_BUSY_S` for `READING_S` after a descriptor fetch, every
    `PROGRESS_IDLE_S` otherwise."""

    def __init__(self, agent, servicer: _DescriptorServicer):
        super().__init__(name="nixl-progress", daemon=True)
        self.agent, self.servicer = agent, servicer
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.agent.get_new_notifs()
            reading = time.monotonic() - self.servicer.last_fetch < READING_S
            self.stopped.wait(PROGRESS_BUSY_S if reading else PROGRESS_IDLE_S)


class NixlPublisher(WeightPublisher):
    """Packs each snapshot into the next of `keep_last` registered buffers and serves its
    descriptor on `bind_host:port` (default `host`); advertises `nixl://host:port`."""

    def __init__(self, host: str, port: int, keep_last: int | None, transports: list[str],
                 bind_host: str | None = None):
        if keep_last is None:
            raise ValueError("weights.keep_last: 'nixl' keeps each held snapshot in registered memory; "
                             "set how many to keep (1 or more)")
        self.transports = transports
        self.agent = make_agent("trainer", transports)
        self.address = f"{host}:{port}"
        self.slots = [_Slot() for _ in range(keep_last)]
        self._turn = 0
        self._generation = 0
        self.servicer = _DescriptorServicer(keep_last)
        self.progress = _Progress(self.agent, self.servicer)
        self.progress.start()
        self.server = serve_weights(self.servicer, f"{bind_host or host}:{port}")

    def publish(self, state_dict, step):
        entries, nbytes = layout(state_dict)
        slot = self.slots[self._turn]
        self._turn = (self._turn + 1) % len(self.slots)
        for each in self.slots:  # off the server before rewriting: a reader's check then fails
            if each is slot or each.step == step:
                if each.step is not None:
                    self.servicer.discard(each.step)
                each.step = None
        if slot.buffer is None or slot.buffer.tensor.numel() < nbytes:
            if slot.buffer is not None:
                slot.buffer.release()
            slot.buffer = _Registered(self.agent, nbytes)
            self.metadata = self.agent.get_agent_metadata()  # it carries the registered memory's keys
        for view, tensor in zip(unpacked(slot.buffer.tensor, entries).values(), state_dict.values(), strict=True):
            view.copy_(tensor)
        self._generation += 1
        slot.step = step
        descriptor = {
            "step": step, "generation": self._generation, "agent": self.agent.name,
            "metadata": self.metadata.hex(), "address": slot.buffer.tensor.data_ptr(), "bytes": nbytes,
            "tensors": entries, "transports": self.transports,
        }
        marker = json.dumps({"step": step, "files": [DESCRIPTOR]}).encode()
        self.servicer.add(step, {DESCRIPTOR: json.dumps(descriptor).encode(), COMPLETE: marker})
        return f"{NIXL_SCHEME}{self.address}"

    def expect(self, step):
        self.servicer.expect(step)

    def close(self):
        self.server.stop(grace=5).wait()
        self.progress.stopped.set()
        self.progress.join()
        for slot in self.slots:
            if slot.buffer is not None:
                slot.buffer.release()


def _descriptor(address: str, step: int, timeout: float) -> dict:
    files = fetch_snapshot(address, step, timeout)
    if DESCRIPTOR not in files:
        raise ConnectionError(f"{NIXL_SCHEME}{address} served step {step} without a NIXL descriptor "
                              "(is the trainer's weights.type 'nixl'?)")
    return json.loads(bytes(files[DESCRIPTOR]))


class NixlReceiver:
    """An inference worker's side: one agent and one registered buffer, reused by every load."""

    def __init__(self):
        self.agent = None
        self.buffer: _Registered | None = None
        self.remote: tuple[str, str] | None = None  # the trainer agent's metadata, its name as added
        self._lock = threading.Lock()

    def receive(self, address: str, step: int, timeout: float) -> tuple[int, dict[str, torch.Tensor]]:
        """Read policy `step` (-1: the newest) from the trainer at `address` ("host:port"):
        the step read and its tensors, views of this receiver's buffer (valid until the next
        `receive`)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            descriptor = _descriptor(address, step, timeout)
            self._read(descriptor, deadline, address)
            again = _descriptor(address, descriptor["step"], max(1.0, deadline - time.monotonic()))
            if again["generation"] != descriptor["generation"]:
                raise ConnectionError(f"weights of step {descriptor['step']} at {NIXL_SCHEME}{address} were "
                                      "republished while they were read")
            return descriptor["step"], unpacked(self.buffer.tensor, descriptor["tensors"])

    def _read(self, descriptor: dict, deadline: float, address: str) -> None:
        if self.agent is None:
            self.agent = make_agent("inference", descriptor["transports"])
        nbytes = descriptor["bytes"]
        if self.buffer is None or self.buffer.tensor.numel() < nbytes:
            if self.buffer is not None:
                self.buffer.release()
            self.buffer = _Registered(self.agent, nbytes)
        remote = self._remote(descriptor)
        pieces = [(start, min(READ_BYTES, nbytes - start)) for start in range(0, nbytes, READ_BYTES)]
        here, there = self.buffer.tensor.data_ptr(), descriptor["address"]
        local = self.agent.get_xfer_descs([(here + start, size, 0) for start, size in pieces], "DRAM")
        source = self.agent.get_xfer_descs([(there + start, size, 0) for start, size in pieces], "DRAM")
        handle = self.agent.initialize_xfer("READ", local, source, remote)
        state = "ERR"
        try:
            state = self.agent.transfer(handle)
            while state == "PROC" and time.monotonic() < deadline:
                time.sleep(_POLL_S)
                state = self.agent.check_xfer_state(handle)
        finally:
            if state == "PROC":
                logger.warning("abandoning an unfinished NIXL read from %s", address)
            handle.release()
        if state != "DONE":
            what = "timed out" if state == "PROC" else "failed"
            raise ConnectionError(f"reading weights of step {descriptor['step']} from {NIXL_SCHEME}{address} over "
                                  f"NIXL ({','.join(descriptor['transports'])}) {what}")

    def _remote(self, descriptor: dict) -> str:
        """The trainer's agent, added again when its metadata changed (it registered a new
        buffer, or it is a restarted trainer's)."""
        metadata = descriptor["metadata"]
        if self.remote is None or self.remote[0] != metadata:
            if self.remote is not None:
                self.agent.remove_remote_agent(self.remote[1])
            self.remote = (metadata, self.agent.add_remote_agent(bytes.fromhex(metadata)))
        return self.remote[1]
