"""Delta weight updates (`weights.delta`): after a full snapshot, each policy travels as the
elements that changed since the policy before it, bit for bit in the wire dtype.

Why it pays: the trainer's master weights are float32, the wire is usually bfloat16, and an
optimizer step at RL learning rates moves most weights by less than half a bfloat16 step, so
their bfloat16 bits do not change (benchmarks/delta_weights.py measures how many do).

The form: per tensor, where the elements whose bits changed are, as 16-bit gaps from one to the
next (`<name>@gap`; a gap word 0 advances 65535 elements and names none, for the rare longer
gap), and their new values (`<name>@val`), in a `delta.safetensors`. That is 4 bytes per changed
bfloat16 element against 2 per element of a full snapshot (int32 indices would take 6: at 3 %
changed, 11x fewer bytes instead of 16x); a tensor that would take more travels whole
(`<name>`), and one that did not change not at all. An XOR against the previous policy would be
as large as the tensor until compressed (another dependency and CPU time per publish on the
trainer); gaps and values need no compressor, and a prefix sum and one indexed copy apply them.

The chain: every snapshot of a delta run (files and `COMPLETE` marker as any snapshot,
rlkube.transport.weights_snapshot) carries an `id` in its marker, and a delta also its `base`
step and `base_id`. A full snapshot is published first, then at least every `full_every`
publishes, after a resume, and in place of a delta that would not be meaningfully smaller
(`FULL_AT`: half its bytes or more; at a high learning rate most elements change each step).
A replica (`PolicyReplica`) applies a delta when it holds the delta's base id; otherwise it
follows the bases back to the one it holds or to a full snapshot and applies forward from
there: a replica that missed a delta fetches that delta, one that joins or restarts (or holds
a policy of an abandoned continuation: ids, not steps, must match) fetches the last full
snapshot and the deltas after it. The transports keep each kept snapshot's chain back to its
full snapshot (`bases_needed`).

A transport takes part by publishing a prepared snapshot (`publish_snapshot(snapshot) ->
location`: storage and gRPC do; a NIXL transport that moves snapshot files can too) and, on the
replica, by reading a step's files (`ChainReader`). Its locations travel as `delta:<location>`,
which tells the inference worker to load through its `PolicyReplica`.
"""

import json
import posixpath
import uuid
from collections.abc import Callable

import torch

from rlkube.transport.weights import WeightPublisher
from rlkube.transport.weights_snapshot import COMPLETE, Snapshot, iter_safetensors, step_dir

DELTA_SCHEME = "delta:"
DELTA_FILE = "delta.safetensors"
_GRPC = "grpc://"
_GAPS, _VALUES = "@gap", "@val"
_SPAN = 65535
"""The largest gap one 16-bit word holds; the word 0 advances this far and names no element."""
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
FULL_AT = 0.5
"""A delta of this share of the full snapshot's bytes or more goes as the full snapshot. Past
it a delta saves less than half of one publish's bytes and costs more than the full one
elsewhere: each replica scatters it into its copy, and one that joins or missed an update
reads the full snapshot and every delta after it (at half a snapshot each, up to 5.5
snapshots' bytes with `full_every` 10), where a full one ends the chain. The measured cases
lie far either side (benchmarks/delta_weights.py): ~8 % of the bytes or less at RL learning
rates in bfloat16, 99.8 % or more at the reverse-text example's lr 2e-4."""

Files = dict[str, bytes | bytearray]


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s storage as integers of its width, flat: equal bits, not equal values (NaN, -0.0)."""
    return tensor.reshape(-1).view(_BITS[tensor.element_size()])


def encode_delta(base: dict[str, torch.Tensor], new: dict[str, torch.Tensor],
                 limit: float | None = None) -> dict[str, torch.Tensor] | None:
    """The tensors of a delta turning `base` into `new` (same names, shapes and dtypes); None
    as soon as their bytes reach `limit` (the tensors after that are not compared)."""
    if base.keys() != new.keys():
        raise ValueError(f"a delta needs the base's tensors: {sorted(base.keys() ^ new.keys())} differ")
    out, size = {}, 0
    for name, tensor in new.items():
        old = base[name]
        if old.shape != tensor.shape or old.dtype != tensor.dtype:
            raise ValueError(f"{name}: {tuple(tensor.shape)} {tensor.dtype} against a base of "
                             f"{tuple(old.shape)} {old.dtype}")
        changed = torch.ne(_bits(tensor), _bits(old))
        count = int(torch.count_nonzero(changed))
        if not count:
            continue
        part = _encode(name, tensor, changed, count)
        out |= part
        size += bytes_of(part)
        if limit is not None and size >= limit:
            return None
    return out


def _encode(name: str, tensor: torch.Tensor, changed: torch.Tensor, count: int) -> dict[str, torch.Tensor]:
    """A changed tensor's part of a delta: the gaps and values of its `count` `changed`
    elements (a flat mask), or the tensor whole where that takes no more bytes. Each changed
    element takes a gap word and its value at least, so a tensor that many fill is sent whole
    without listing its positions (the costly part when most elements change)."""
    if count * (2 + tensor.element_size()) < tensor.nbytes:
        positions = changed.nonzero().squeeze(1)
        gaps = _gaps(positions)
        if gaps.nbytes + count * tensor.element_size() < tensor.nbytes:
            return {name + _GAPS: gaps, name + _VALUES: tensor.reshape(-1)[positions]}
    return {name: tensor.detach().clone()}


def _gaps(positions: torch.Tensor) -> torch.Tensor:
    """Ascending flat `positions` as 16-bit gap words (int16 storage of 1..65535; 0: skip `_SPAN`)."""
    gaps = torch.diff(positions, prepend=positions.new_tensor([-1]))
    skips = (gaps - 1) // _SPAN
    words = torch.zeros(int(skips.sum()) + gaps.numel(), dtype=torch.int32)
    words[torch.cumsum(skips + 1, 0) - 1] = (gaps - skips * _SPAN).to(torch.int32)
    return (words - 65536 * (words > 32767)).to(torch.int16)


def _positions(words: torch.Tensor) -> torch.Tensor:
    """The flat positions `_gaps` encoded."""
    words = words.to(torch.int64) & 0xFFFF
    return (torch.cumsum(torch.where(words == 0, _SPAN, words), 0) - 1)[words != 0]


def apply_delta(tensors: dict[str, torch.Tensor], delta: dict[str, torch.Tensor]) -> None:
    """Patch `tensors` (contiguous, writable) in place with the tensors of a delta."""
    for key, value in delta.items():
        if key.endswith(_VALUES):
            continue
        name = key.removesuffix(_GAPS)
        if name not in tensors:
            raise ValueError(f"the weight delta names {name}, which the policy it applies to lacks")
        if key.endswith(_GAPS):
            tensors[name].view(-1)[_positions(value)] = delta[name + _VALUES]
        else:
            tensors[name].copy_(value)


def bytes_of(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors.values())


class ChainedSnapshot(Snapshot):
    """A snapshot of a delta run: a full one, or a delta (`base` given: the step it applies to
    and that snapshot's id). Its marker names its `id`, and a delta's its base."""

    def __init__(self, tensors: dict[str, torch.Tensor], step: int, model_dir: str,
                 base: tuple[int, str] | None = None):
        self.id = uuid.uuid4().hex
        self.link = {"id": self.id}
        if base is None:
            super().__init__(tensors, step, model_dir)
            return
        self.step, self.model_files, self.shards = step, {}, {DELTA_FILE: tensors}
        self.link |= {"base": base[0], "base_id": base[1]}

    def marker(self) -> bytes:
        return json.dumps({**json.loads(super().marker()), **self.link}).encode()


class DeltaPublisher(WeightPublisher):
    """Publishes through `inner` (a transport with `publish_snapshot`) a full snapshot, then
    deltas against the policy published before, a full one at least every `full_every`, and a
    full one instead of a delta that would take `FULL_AT` of its bytes or more. Step
    `final_step` (the run's last) goes out full too: that snapshot is the run's result, which an
    eval or a user loads as a model directory; a delta is not one.

    Keeps a copy of the last published policy (host memory: the model in the wire dtype), since
    the tensors `publish` is given are overwritten by the next snapshot."""

    def __init__(self, inner: WeightPublisher, model_dir: str, full_every: int, final_step: int | None = None):
        if not hasattr(inner, "publish_snapshot"):
            raise ValueError(f"weights.delta: the {type(inner).__name__} transport cannot send deltas "
                             "(use weights.type 'storage' or 'grpc')")
        self.inner, self.model_dir, self.full_every, self.final_step = inner, model_dir, full_every, final_step
        self.base: dict[str, torch.Tensor] = {}
        self.base_link: tuple[int, str] | None = None
        """(step, id) of the last published policy; None when the next publish must be full."""
        self.deltas_since_full = 0
        self.last_bytes = 0
        """Tensor bytes of the newest publish (the delta's, or the full snapshot's)."""

    def publish(self, state_dict, step):
        tensors = None
        if self.base_link is not None and self.deltas_since_full + 1 < self.full_every and step != self.final_step:
            tensors = encode_delta(self.base, state_dict, limit=FULL_AT * bytes_of(state_dict))
        if tensors is None:
            snapshot = ChainedSnapshot(state_dict, step, self.model_dir)
            self.last_bytes, self.deltas_since_full = bytes_of(state_dict), 0
        else:
            snapshot = ChainedSnapshot(tensors, step, self.model_dir, base=self.base_link)
            self.last_bytes = bytes_of(tensors)
            self.deltas_since_full += 1
        location = self.inner.publish_snapshot(snapshot)
        self._remember(state_dict, (step, snapshot.id))
        return DELTA_SCHEME + location

    def published_bytes(self, state_dict):
        return self.last_bytes

    def republish(self, state_dict, step):
        """As the transport republishes; the snapshot it keeps or writes carries no id, so
        the next publish is a full one."""
        self.inner.republish(state_dict, step)
        self._remember(state_dict, None)

    def _remember(self, state_dict: dict[str, torch.Tensor], link: tuple[int, str] | None) -> None:
        for name, tensor in state_dict.items():
            kept = self.base.get(name)
            if kept is None or kept.shape != tensor.shape or kept.dtype != tensor.dtype:
                self.base[name] = kept = torch.empty_like(tensor, device="cpu")
            kept.copy_(tensor)
        self.base_link = link

    def expect(self, step):
        self.inner.expect(step)

    def close(self):
        self.inner.close()


class ChainReader:
    """A replica's view of a delta run's snapshots, from a `delta:` location: step N's files
    (the safetensors files and the marker) from the same trainer's server or storage root."""

    def __init__(self, location: str, timeout: float):
        self.location, self.timeout = location.removeprefix(DELTA_SCHEME), timeout
        self.address = self.location.removeprefix(_GRPC) if self.location.startswith(_GRPC) else None

    def first(self, step: int) -> Files:
        """The snapshot the location names (gRPC: step `step`), waited for up to the timeout."""
        return self._fetch(step) if self.address else self._read(self.location, self.timeout)

    def read(self, step: int) -> Files:
        """Step `step` of the same run, a base of the one asked for."""
        if self.address:
            return self._fetch(step)
        return self._read(step_dir(posixpath.dirname(self.location.rstrip("/")), step), 0)

    def _fetch(self, step: int) -> Files:
        from rlkube.transport.weights_grpc import fetch_snapshot

        return fetch_snapshot(self.address, step, self.timeout)

    @staticmethod
    def _read(location: str, timeout: float) -> Files:
        import fsspec

        from rlkube.transport.weights_storage import wait_for_marker

        marker = wait_for_marker(location, timeout)
        fs, path = fsspec.core.url_to_fs(location)
        names = [name for name in marker["files"] if name.endswith(".safetensors")]
        files = {name: bytearray(fs.cat_file(f"{path.rstrip('/')}/{name}")) for name in names}
        return files | {COMPLETE: json.dumps(marker).encode()}


class PolicyReplica:
    """A replica's copy of the policy it serves, in the wire dtype under the checkpoint's names
    (what it hands to the engine's load): patched by each delta, replaced by a full snapshot."""

    def __init__(self):
        self.step: int | None = None
        self.id: str | None = None
        self.tensors: dict[str, torch.Tensor] = {}

    def update(self, first: Files, read: Callable[[int], Files]) -> dict[str, torch.Tensor]:
        """The policy of snapshot `first`, reading (`read(step)`) the snapshots back to one
        whose base this replica holds, or to a full one. Returns the whole policy."""
        chain = [first]
        while (link := _link(chain[-1])).get("base_id") not in (None, self.id):
            chain.append(read(link["base"]))
        try:
            for files in reversed(chain):
                link = _link(files)
                if "base_id" in link:
                    apply_delta(self.tensors, dict(iter_safetensors({DELTA_FILE: files[DELTA_FILE]})))
                else:
                    self.tensors = dict(iter_safetensors(files))
                self.step, self.id = link["step"], link.get("id")
        except Exception:
            self.step, self.id = None, None  # half applied: the next update starts from a full snapshot
            raise
        return self.tensors


def _link(files: Files) -> dict:
    return json.loads(bytes(files[COMPLETE]))
