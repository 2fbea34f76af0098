"""A packed micro-batch as the trainer sees it (a dict of tensors) <-> its proto message."""

import torch

from rlkube.transport import rlkube_pb2 as pb
from rlkube.transport.tensors import from_proto, to_proto

TENSOR_FIELDS = {
    "input_ids": torch.int64,
    "position_ids": torch.int64,
    "sample_ids": torch.int32,
    "prefix_ids": torch.int32,
    "loss_mask": torch.bool,
    "advantages": torch.float32,
    "inference_logprobs": torch.float32,
    "temperatures": torch.float32,
}
"""Every micro-batch carries these `[rows, seq_len]` tensors, with these dtypes."""

OPTIONAL_TENSOR_FIELDS = {
    "teacher_logprobs": torch.float32,
    "routed_experts": torch.int16,
}
"""Tensors a micro-batch carries only in some runs: `[rows, seq_len]` teacher log-probs (with a
teacher), `[rows, seq_len, layers, top_k]` routed experts (MoE, routing returned)."""


def to_message(micro_batch: dict, step: int, rank: int, index: int, count: int) -> pb.MicroBatch:
    """`micro_batch` holds TENSOR_FIELDS, any of OPTIONAL_TENSOR_FIELDS, plus
    `global_loss_tokens` (an int)."""
    tensors = {}
    dtypes = TENSOR_FIELDS | {name: dtype for name, dtype in OPTIONAL_TENSOR_FIELDS.items() if name in micro_batch}
    for name, dtype in dtypes.items():
        tensor = micro_batch[name]
        if tensor.dtype != dtype:
            raise ValueError(f"micro-batch field '{name}' must be {dtype}, got {tensor.dtype}")
        tensors[name] = to_proto(tensor)
    return pb.MicroBatch(
        step=step,
        rank=rank,
        index=index,
        count=count,
        global_loss_tokens=int(micro_batch["global_loss_tokens"]),
        **tensors,
    )


def from_message(message: pb.MicroBatch) -> dict:
    """The trainer's view: TENSOR_FIELDS and the OPTIONAL_TENSOR_FIELDS it carries as
    tensors, plus `global_loss_tokens`, `step`, `index` and `count` as ints."""
    names = [*TENSOR_FIELDS, *(name for name in OPTIONAL_TENSOR_FIELDS if message.HasField(name))]
    batch = {name: from_proto(getattr(message, name)) for name in names}
    batch.update(
        global_loss_tokens=message.global_loss_tokens,
        step=message.step,
        index=message.index,
        count=message.count,
    )
    return batch
