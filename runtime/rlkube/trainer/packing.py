"""Sequence packing: many short samples into fixed `seq_len` rows.

Each sample keeps its own positions (position_ids restart at 0), which is what tells
Hugging Face models where one sample ends and the next begins: with `attention_mask=None`
and position_ids given, transformers builds a block-diagonal causal mask, so no token
attends across samples. Targets are shifted inside each sample (the last token of a
sample predicts nothing), so the loss never crosses a boundary either.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class Sample:
    """One tokenized sample: `loss_mask[i]` says whether token i is trained on (predicted)."""

    input_ids: list[int]
    loss_mask: list[bool]

    def __post_init__(self) -> None:
        if len(self.input_ids) != len(self.loss_mask):
            raise ValueError(
                f"input_ids ({len(self.input_ids)}) and loss_mask ({len(self.loss_mask)}) differ in length"
            )


@dataclass
class Row:
    """One packed row of at most `seq_len` tokens (padded on collation)."""

    input_ids: list[int] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    target_ids: list[int] = field(default_factory=list)
    target_mask: list[bool] = field(default_factory=list)

    def add(self, sample: Sample) -> None:
        ids, mask = sample.input_ids, sample.loss_mask
        self.input_ids += ids
        self.position_ids += range(len(ids))
        self.target_ids += ids[1:] + [0]
        self.target_mask += mask[1:] + [False]

    def __len__(self) -> int:
        return len(self.input_ids)


def truncate(sample: Sample, seq_len: int) -> Sample:
    return Sample(sample.input_ids[:seq_len], sample.loss_mask[:seq_len])


def pack(samples: list[Sample], seq_len: int) -> list[Row]:
    """Pack in order, first fit: each sample (truncated to `seq_len`) goes into the first
    row with room, else starts a new row. Deterministic."""
    rows: list[Row] = []
    for sample in samples:
        sample = truncate(sample, seq_len)
        for row in rows:
            if len(row) + len(sample.input_ids) <= seq_len:
                row.add(sample)
                break
        else:
            row = Row()
            row.add(sample)
            rows.append(row)
    return rows


def collate(rows: list[Row], seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Rows to `[len(rows), seq_len]` tensors: input_ids, position_ids, target_ids, loss_mask.

    Padding is its own segment (positions from 0) that no loss reads.
    """
    batch = {k: torch.zeros(len(rows), seq_len, dtype=torch.long) for k in ("input_ids", "position_ids", "target_ids")}
    batch["loss_mask"] = torch.zeros(len(rows), seq_len, dtype=torch.bool)
    for i, row in enumerate(rows):
        n = len(row)
        batch["input_ids"][i, :n] = torch.tensor(row.input_ids)
        batch["input_ids"][i, n:] = pad_id
        batch["position_ids"][i, :n] = torch.tensor(row.position_ids)
        batch["position_ids"][i, n:] = torch.arange(seq_len - n)
        batch["target_ids"][i, :n] = torch.tensor(row.target_ids)
        batch["loss_mask"][i, :n] = torch.tensor(row.target_mask)
    return batch


def empty_row_batch(num_rows: int, seq_len: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Rows with no loss tokens, so every rank runs the same number of micro-batches."""
    return collate([Row() for _ in range(num_rows)], seq_len, pad_id)
