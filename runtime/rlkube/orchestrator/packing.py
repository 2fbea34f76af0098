"""Pack a step's samples into rows of `seq_len` tokens for each trainer data-parallel rank.

1. Blocks: samples with the same prompt (every token before the first trained one: a GRPO
   group, or the first turn of multi-turn rollouts) share ONE copy of it (`share_prompts`).
   A block is that prompt followed by each sample's remaining tokens, so the trainer runs the
   prompt once per block instead of once per sample (a reverse-text group of 8 shrinks from
   ~400 tokens to ~190).
2. Rows: first-fit decreasing (largest block first, into the first row with room), so rows
   are nearly full and few. A group too large for the room left is split into several blocks,
   each with its own copy of the prompt. A sample longer than `seq_len` is cut to `seq_len`.
3. Ranks: every rank gets the same number of rows, so the same number of micro-batches (FSDP's
   collectives need every rank to run the same number of forward/backward passes); rows go,
   largest first, to the rank with the fewest tokens so far. Missing rows are padding
   (segment -1, no loss tokens). A rank's last micro-batch may have fewer rows.
4. Every micro-batch carries the step's global loss-token count, which the trainer divides by
   (so the loss does not depend on how samples were split across ranks).

Within a row every token belongs to a segment (`sample_ids`): a sample's own tokens carry the
sample's index in the step, a shared prompt an index after all samples, padding -1. On a
sample's tokens `prefix_ids` names the shared prompt's segment it continues (-1 elsewhere), and
`position_ids` continue from the prompt's length. The trainer lets each token attend to the
earlier tokens of its own segment and of that prompt segment: exactly the tokens the unshared
sample would see, so sharing changes the cost, not the result.
"""

from dataclasses import dataclass

import torch

from rlkube.rollout_types import Sample


@dataclass
class Block:
    """Samples laid out after one copy of their common first `prefix_len` tokens (0: none)."""

    prefix_len: int
    samples: list[Sample]

    @property
    def num_tokens(self) -> int:
        return self.prefix_len + sum(len(s.token_ids) - self.prefix_len for s in self.samples)


Row = list[Block]


def prompt_len(sample: Sample) -> int:
    """Tokens before the first trained token."""
    return next((i for i, trained in enumerate(sample.loss_mask) if trained), len(sample.loss_mask))


def group_by_prompt(samples: list[Sample], share_prompts: bool) -> list[tuple[int, list[Sample]]]:
    """(prefix_len, samples) per prompt: samples that can share one copy of it, else alone.
    Only samples drawn at the same temperature share: the prompt's last token predicts the
    first token of each, and the trainer applies one temperature per position."""
    if not share_prompts:
        return [(0, [s]) for s in samples]
    groups: dict[tuple[float, tuple[int, ...]], list[Sample]] = {}
    for sample in samples:
        key = (sample.temperature, tuple(sample.token_ids[: prompt_len(sample)]))
        groups.setdefault(key, []).append(sample)
    out: list[tuple[int, list[Sample]]] = []
    for (_, prompt), group in groups.items():
        if len(group) > 1 and 0 < len(prompt) < min(len(s.token_ids) for s in group):
            out.append((len(prompt), group))
        else:
            out.extend((0, [s]) for s in group)
    return out


def pack_rows(samples: list[Sample], seq_len: int, share_prompts: bool = True) -> list[Row]:
    rows: list[Row] = []
    free: list[int] = []
    truncated = [_truncate(s, seq_len) for s in samples]
    groups = group_by_prompt(truncated, share_prompts)
    for prefix_len, group in sorted(groups, key=lambda g: -Block(*g).num_tokens):
        pending = sorted(group, key=lambda s: -len(s.token_ids))
        while pending:
            need = len(pending[0].token_ids)  # the prompt and the longest pending sample
            r = next((r for r, room in enumerate(free) if need <= room), len(rows))
            if r == len(rows):
                rows.append([])
                free.append(seq_len)
            block, rest, room = Block(prefix_len, []), [], free[r] - prefix_len
            for sample in pending:
                n = len(sample.token_ids) - prefix_len
                if n <= room:
                    block.samples.append(sample)
                    room -= n
                else:
                    rest.append(sample)
            rows[r].append(block)
            free[r], pending = room, rest
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
        teacher_logprobs=None if sample.teacher_logprobs is None else sample.teacher_logprobs[:seq_len],
        routed_experts=None if sample.routed_experts is None else sample.routed_experts[:seq_len],
    )


def row_tokens(row: Row) -> int:
    return sum(block.num_tokens for block in row)


def assign_rows(rows: list[Row], world_size: int) -> list[list[Row]]:
    """Rows per rank: equal counts (padded with empty rows), balanced token totals."""
    per_rank = max(1, -(-len(rows) // world_size))
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


def teacher_scored(samples: list[Sample]) -> bool:
    """Whether the step's samples carry teacher log-probs: all of them or none (a sample
    without them would silently train toward log-prob 0)."""
    scored = {s.teacher_logprobs is not None for s in samples}
    if len(scored) > 1:
        raise ValueError("some samples of the step have teacher_logprobs and some do not")
    return scored == {True}


def routing_shape(samples: list[Sample]) -> tuple[int, int] | None:
    """(layers, top_k) of the step's routed experts; None when no sample carries any. A
    sample without them (its engine answer had none) gets -1, the trainer's own routing."""
    shapes = {s.routed_experts.shape[1:] for s in samples if s.routed_experts is not None}
    if len(shapes) > 1:
        raise ValueError(f"the step's samples carry routed_experts of different shapes: {sorted(shapes)}")
    return shapes.pop() if shapes else None


def rows_to_tensors(
    rows: list[Row], seq_len: int, segments: dict[int, int], with_teacher: bool = False,
    routing: tuple[int, int] | None = None,
) -> dict[str, torch.Tensor]:
    """`[len(rows), seq_len]` tensors; `segments` maps id(sample) to its index in the step and
    id(block) to its shared prompt's segment index. `with_teacher` adds `teacher_logprobs`,
    `routing` (layers, top_k) adds `routed_experts`."""
    shape = (len(rows), seq_len)
    out = {
        "input_ids": torch.zeros(shape, dtype=torch.int64),
        "position_ids": torch.zeros(shape, dtype=torch.int64),
        "sample_ids": torch.full(shape, -1, dtype=torch.int32),
        "prefix_ids": torch.full(shape, -1, dtype=torch.int32),
        "loss_mask": torch.zeros(shape, dtype=torch.bool),
        "advantages": torch.zeros(shape, dtype=torch.float32),
        "inference_logprobs": torch.zeros(shape, dtype=torch.float32),
        "temperatures": torch.ones(shape, dtype=torch.float32),
    }
    if with_teacher:
        out["teacher_logprobs"] = torch.zeros(shape, dtype=torch.float32)
    if routing is not None:
        out["routed_experts"] = torch.full((*shape, *routing), -1, dtype=torch.int16)

    def write(r: int, start: int, sample: Sample, begin: int, end: int, segment: int, prefix: int) -> int:
        """Tokens `begin:end` of `sample` at `start` of row `r`; returns where they end."""
        span = slice(start, start + end - begin)
        mask = torch.tensor(sample.loss_mask[begin:end], dtype=torch.bool)
        out["input_ids"][r, span] = torch.tensor(sample.token_ids[begin:end], dtype=torch.int64)
        out["position_ids"][r, span] = torch.arange(begin, end)
        out["sample_ids"][r, span] = segment
        out["prefix_ids"][r, span] = prefix
        out["loss_mask"][r, span] = mask
        out["advantages"][r, span] = mask * sample.advantage
        out["inference_logprobs"][r, span] = torch.tensor(sample.logprobs[begin:end], dtype=torch.float32)
        out["temperatures"][r, span] = sample.temperature
        if with_teacher:
            out["teacher_logprobs"][r, span] = torch.tensor(sample.teacher_logprobs[begin:end], dtype=torch.float32)
        if routing is not None and sample.routed_experts is not None:
            out["routed_experts"][r, span] = torch.from_numpy(sample.routed_experts[begin:end])
        return span.stop

    for r, row in enumerate(rows):
        start = 0
        for block in row:
            prefix = segments[id(block)] if block.prefix_len else -1
            if block.prefix_len:  # the prompt once: no trained tokens, by definition of prompt_len
                start = write(r, start, block.samples[0], 0, block.prefix_len, prefix, -1)
            for sample in block.samples:
                end = len(sample.token_ids)
                start = write(r, start, sample, block.prefix_len, end, segments[id(sample)], prefix)
    return out


def pack_batch(
    samples: list[Sample], seq_len: int, world_size: int, micro_batch_rows: int = 1, share_prompts: bool = True
) -> list[list[dict]]:
    """Per rank, its micro-batches: dicts of `[rows, seq_len]` tensors (at most
    `micro_batch_rows` rows) plus `global_loss_tokens`. Every rank gets the same number of
    micro-batches, at least one, even from no samples."""
    if world_size < 1 or micro_batch_rows < 1:
        raise ValueError(f"world_size ({world_size}) and micro_batch_rows ({micro_batch_rows}) must be >= 1")
    rows = pack_rows(samples, seq_len, share_prompts)
    blocks = [block for row in rows for block in row]
    packed = [s for block in blocks for s in block.samples]
    segments = {id(s): i for i, s in enumerate(packed)}
    shared = [block for block in blocks if block.prefix_len]
    segments |= {id(block): len(packed) + i for i, block in enumerate(shared)}
    global_loss_tokens = sum(s.num_loss_tokens for s in packed)
    with_teacher, routing = teacher_scored(packed), routing_shape(packed)
    per_rank = []
    for rank_rows in assign_rows(rows, world_size):
        micro_batches = []
        for i in range(0, len(rank_rows), micro_batch_rows):
            tensors = rows_to_tensors(rank_rows[i : i + micro_batch_rows], seq_len, segments, with_teacher, routing)
            micro_batches.append(tensors | {"global_loss_tokens": global_loss_tokens})
        per_rank.append(micro_batches)
    return per_rank
