"""torch tensors <-> proto `Tensor`: raw little-endian bytes plus dtype and shape.

Bit-exact by construction (the bytes are the tensor's storage), and fast: one copy each way,
never a Python list of numbers.
"""

import sys

import torch

from rlkube.transport import rlkube_pb2 as pb

if sys.byteorder != "little":  # torch itself only ships for little-endian machines
    raise ImportError("rlkube's tensor transport needs a little-endian machine")

_DTYPES = {
    name: getattr(torch, name)
    for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
}
# bfloat16 has no numpy twin: its bytes travel through an int16 view.
_VIEW_AS = {torch.bfloat16: torch.int16, torch.bool: torch.uint8}


def _dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"tensor dtype {dtype} cannot be sent (supported: {', '.join(_DTYPES)})")
    return name


def to_proto(tensor: torch.Tensor) -> pb.Tensor:
    tensor = tensor.detach().to("cpu").contiguous()
    name = _dtype_name(tensor.dtype)
    flat = tensor.reshape(-1).view(_VIEW_AS.get(tensor.dtype, tensor.dtype))
    return pb.Tensor(dtype=name, shape=list(tensor.shape), data=flat.numpy().tobytes())


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for size in shape:
        n *= size
    return n


def from_proto(message: pb.Tensor) -> torch.Tensor:
    """A writable tensor owning its memory (the message's bytes are immutable)."""
    if message.dtype not in _DTYPES:
        raise ValueError(f"Tensor.dtype '{message.dtype}' is not one of {', '.join(_DTYPES)}")
    dtype = _DTYPES[message.dtype]
    wire = _VIEW_AS.get(dtype, dtype)
    shape = tuple(message.shape)
    expected = wire.itemsize * _numel(shape)
    if len(message.data) != expected:
        raise ValueError(
            f"Tensor of dtype {message.dtype} and shape {list(shape)} needs {expected} bytes, "
            f"got {len(message.data)}"
        )
    flat = torch.frombuffer(bytearray(message.data), dtype=wire) if expected else torch.empty(0, dtype=wire)
    return flat.view(dtype).reshape(shape)
