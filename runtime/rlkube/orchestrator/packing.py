"""Pack a step's samples into rows of `seq_len` tokens for each trainer data-parallel rank.

1. Rows: first-fit decreasing (longest sample first, into the first row with room), so rows
   are nearly full and few. A sample longer than `seq_len` is cut to `seq_len`.
2. Ranks: every rank gets the same number of rows (a multiple of the micro-batch size:
   FSDP's collectives need every rank to run the same number of forward/backward passes);
   rows go, longest first, to the rank with the fewest tokens so far. Missing rows are
   padding (sample id -1, no loss tokens).
3. Every micro-batch carries the step's global loss-token count, which the trainer divides by
   (so the loss does not depend on how samples were split across ranks).

Within a row, `position_ids` restart at 0 at each sample and `sample_ids` tell samples apart,
so the trainer can keep attention inside each sample.
"""

import torch

from rlkube.orchestrator.types import Sample

Row = list[Sample]


def pack_rows(samples: list[Sample], seq_len: int) -> list[Row]:
    rows: list[Row] = []
    free: list[int] = []
    order = sorted(range(len(samples)), key=lambda i: -len(samples[i].token_ids))
    for i in order:
        sample = _truncate(samples[i], seq_len)
        n = len(sample.token_ids)
        for r, room in enumerate(free):
            if n <= room:
                rows[r].append(sample)
                free[r] -= n
                break
        else:
            rows.append([sample])
            free.append(seq_len - n)
    return rows


def _truncate(sample: Sample, seq_len: int) -> Sample:
    if len(sample.token_ids) <= seq_len:
        return sample
    return Sample(
        token_ids=sample.token_ids[:seq_len],
        loss_mask=sample.loss_mask[:seq_len],
        logprobs=sample.logprobs[:seq_len],
        temperature=sample.temperature,
        advantage=sample.advantage,
    )


def row_tokens(row: Row) -> int:
    return sum(len(s.token_ids) for s in row)


def assign_rows(rows: list[Row], world_size: int, micro_batch_rows: int) -> list[list[Row]]:
    """Rows per rank: equal counts (padded with empty rows), balanced token totals."""
    per_rank = max(1, -(-len(rows) // world_size))
    per_rank = -(-per_rank // micro_batch_rows) * micro_batch_rows
    ranks: list[list[Row]] = [[] for _ in range(world_size)]
    tokens = [0] * world_size
    for row in sorted(rows, key=row_tokens, reverse=True):
        open_ranks = [r for r in range(world_size) if len(ranks[r]) < per_rank]
        target = min(open_ranks, key=lambda r: (tokens[r], len(ranks[r])))
        ranks[target].append(row)
        tokens[target] += row_tokens(row)
    for rank_rows in ranks:
        rank_rows.extend([] for _ in range(per_rank - len(rank_rows)))
    return ranks


def rows_to_tensors(rows: list[Row], seq_len: int, sample_index: dict[int, int]) -> dict[str, torch.Tensor]:
    """`[len(rows), seq_len]` tensors; `sample_index` maps id(sample) to its index in the step."""
    shape = (len(rows), seq_len)
    out = {
        "input_ids": torch.zeros(shape, dtype=torch.int64),
        "position_ids": torch.zeros(shape, dtype=torch.int64),
        "sample_ids": torch.full(shape, -1, dtype=torch.int32),
        "loss_mask": torch.zeros(shape, dtype=torch.bool),
        "advantages": torch.zeros(shape, dtype=torch.float32),
        "inference_logprobs": torch.zeros(shape, dtype=torch.float32),
        "temperatures": torch.ones(shape, dtype=torch.float32),
    }
    for r, row in enumerate(rows):
        start = 0
        for sample in row:
            n = len(sample.token_ids)
            span = slice(start, start + n)
            mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
            out["input_ids"][r, span] = torch.tensor(sample.token_ids, dtype=torch.int64)
            out["position_ids"][r, span] = torch.arange(n)
            out["sample_ids"][r, span] = sample_index[id(sample)]
            out["loss_mask"][r, span] = mask
            out["advantages"][r, span] = mask * sample.advantage
            out["inference_logprobs"][r, span] = torch.tensor(sample.logprobs, dtype=torch.float32)
            out["temperatures"][r, span] = sample.temperature
            start += n
    return out


def pack_batch(samples: list[Sample], seq_len: int, world_size: int, micro_batch_rows: int = 1) -> list[list[dict]]:
    """Per rank, its micro-batches: dicts of `[micro_batch_rows, seq_len]` tensors plus
    `global_loss_tokens`. Every rank gets at least one micro-batch, even from no samples."""
    if world_size < 1 or micro_batch_rows < 1:
        raise ValueError(f"world_size ({world_size}) and micro_batch_rows ({micro_batch_rows}) must be >= 1")
    rows = pack_rows(samples, seq_len)
    index = {id(s): i for i, s in enumerate(s for row in rows for s in row)}
    global_loss_tokens = sum(s.num_loss_tokens for row in rows for s in row)
    per_rank = []
    for rank_rows in assign_rows(rows, world_size, micro_batch_rows):
        micro_batches = []
        for i in range(0, len(rank_rows), micro_batch_rows):
            tensors = rows_to_tensors(rank_rows[i : i + micro_batch_rows], seq_len, index)
            micro_batches.append(tensors | {"global_loss_tokens": global_loss_tokens})
        per_rank.append(micro_batches)
    return per_rank
