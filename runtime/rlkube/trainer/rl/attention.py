"""Attention over packed rows in memory linear in the row length: no `seq_len x seq_len` mask.

A packed row's tokens attend by segment (`rlkube/trainer/rl/packed.py` has the rule): a token
sees the earlier tokens of its own segment and of the shared prompt its sample continues.
`Segments` answers "who sees whom" from the two per-token id tensors, and the attention
function below, registered with transformers as `SEGMENT_ATTENTION`, uses it per tile:

- on CUDA, FlexAttention with a `BlockMask` built from the same rule (a fused kernel that
  skips blocks nothing in them sees);
- elsewhere (FlexAttention has no backward on CPU), SDPA per chunk of `QUERY_CHUNK` queries,
  over only the keys that chunk sees, with that tile's mask: memory grows with queries x keys
  actually seen, which for rows of many bounded-length samples is linear in the row length.
  Rows no longer than one chunk take a single call over all rows (the loop costs more there).

Models reach it through transformers' attention interface (`attn_implementation`), which
passes extra forward keyword arguments through to the attention function: `segments=`.
"""

from dataclasses import dataclass, field
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor

SEGMENT_ATTENTION = "rlkube_segments"
QUERY_CHUNK = 512


def _last_at_or_before(sorted_keys: Tensor, segment: Tensor, position: Tensor, seq_len: int) -> Tensor:
    """Per query: the last position <= `position` whose segment is `segment`, -1 if none.
    `sorted_keys` are each row's `(segment + 1) * seq_len + position`, sorted."""
    want = (segment + 1) * seq_len + position
    index = torch.searchsorted(sorted_keys, want, right=True) - 1
    found = sorted_keys.gather(1, index.clamp(min=0))
    hit = (index >= 0) & (found // seq_len == segment + 1)
    return torch.where(hit, found % seq_len, -1)


def _first_of(sorted_keys: Tensor, segment: Tensor, seq_len: int) -> Tensor:
    """Per query: the first position of `segment` in the row, `seq_len` if none."""
    index = torch.searchsorted(sorted_keys, (segment + 1) * seq_len).clamp(max=seq_len - 1)
    found = sorted_keys.gather(1, index)
    return torch.where(found // seq_len == segment + 1, found % seq_len, seq_len)


@dataclass(eq=False)
class Segments:
    """Who sees whom in packed rows: `[rows, seq_len]` segment ids (-1: padding, its own
    segment) and, on a sample's tokens, the shared prompt segment it continues (-1: none)."""

    sample_ids: Tensor
    prefix_ids: Tensor
    _tiles: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.sample_ids = self.sample_ids.long()
        self.prefix_ids = self.prefix_ids.long()
        rows, seq_len = self.sample_ids.shape
        positions = torch.arange(seq_len, device=self.sample_ids.device).expand(rows, -1)
        self._keys = ((self.sample_ids + 1) * seq_len + positions).sort(-1).values

    @property
    def seq_len(self) -> int:
        return self.sample_ids.shape[-1]

    def visible(self, row: Tensor | int, query: Tensor, key: Tensor) -> Tensor:
        """True where query position `query` may attend to key position `key` (broadcasting)."""
        key_segment = self.sample_ids[row, key]
        query_prefix = self.prefix_ids[row, query]
        same = key_segment == self.sample_ids[row, query]
        prompt = (key_segment == query_prefix) & (query_prefix >= 0)
        return (query >= key) & (same | prompt)

    def predictors(self) -> Tensor:
        """`[rows, seq_len]`: the position whose output predicts each token (the nearest
        earlier position it sees), -1 where none does (a sequence's first token)."""
        rows, seq_len = self.sample_ids.shape
        before = torch.arange(seq_len, device=self.sample_ids.device).expand(rows, -1) - 1
        own = _last_at_or_before(self._keys, self.sample_ids, before, seq_len)
        prompt = _last_at_or_before(self._keys, self.prefix_ids.clamp(min=-1), before, seq_len)
        return torch.maximum(own, torch.where(self.prefix_ids >= 0, prompt, -1))

    def first_visible(self) -> Tensor:
        """`[rows, seq_len]`: the lowest key position each query may see."""
        own = _first_of(self._keys, self.sample_ids, self.seq_len)
        prompt = _first_of(self._keys, self.prefix_ids, self.seq_len)
        return torch.minimum(own, torch.where(self.prefix_ids >= 0, prompt, self.seq_len))

    def tile(self, row: int, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """Queries `start:stop` of `row`: the key positions any of them sees, and the
        `[queries, keys]` mask over those. Built once per forward, shared by every layer."""
        if (row, start) not in self._tiles:
            if "first" not in self._tiles:
                self._tiles["first"] = self.first_visible()
            low = int(self._tiles["first"][row, start:stop].min())
            device = self.sample_ids.device
            query = torch.arange(start, stop, device=device).unsqueeze(-1)
            mask = self.visible(row, query, torch.arange(low, stop, device=device))
            seen = mask.any(0).nonzero().squeeze(-1)
            self._tiles[row, start] = (seen + low, mask[:, seen])
        return self._tiles[row, start]

    def rows_mask(self) -> Tensor:
        """`[rows, 1, seq_len, seq_len]`: the whole mask, for rows no longer than one tile."""
        if "rows" not in self._tiles:
            positions = torch.arange(self.seq_len, device=self.sample_ids.device)
            rows = torch.arange(self.sample_ids.shape[0], device=positions.device)[:, None, None]
            self._tiles["rows"] = self.visible(rows, positions[:, None], positions).unsqueeze(1)
        return self._tiles["rows"]

    def block_mask(self):
        """The FlexAttention `BlockMask` of these rows (built once)."""
        if "block_mask" not in self._tiles:
            from torch.nn.attention.flex_attention import create_block_mask

            def mask_mod(b, h, q, k):
                return self.visible(b, q, k)

            rows, seq_len = self.sample_ids.shape
            self._tiles["block_mask"] = create_block_mask(
                mask_mod, rows, None, seq_len, seq_len, device=self.sample_ids.device, _compile=True
            )
        return self._tiles["block_mask"]


def visible_pairs(sample_ids: Tensor, prefix_ids: Tensor) -> int:
    """Query-key pairs `Segments.visible` lets through for the queries of samples and shared
    prompts, per layer and head: the attention work `perf/mfu` counts. A segment of `n` tokens
    in a row holds `n (n + 1) / 2` causal pairs, and every token of a sample that continues a
    shared prompt also sees that whole prompt (the packer puts it first). Padding's queries see
    only padding and train nothing: not counted, as its tokens are not."""
    rows = torch.arange(sample_ids.shape[0]).unsqueeze(-1)
    width = int(sample_ids.max()) + 2  # segment ids -1 .. max
    index = (rows * width + sample_ids.long() + 1).flatten()
    counts = torch.bincount(index, minlength=rows.numel() * width).view(-1, width)[:, 1:]  # [row, segment]
    continues = prefix_ids >= 0
    prompt = counts[rows.expand_as(prefix_ids)[continues], prefix_ids[continues].long()]
    return int((counts * (counts + 1) // 2).sum() + prompt.sum())


@cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _chunked_sdpa(query: Tensor, key: Tensor, value: Tensor, segments: Segments, scale: float | None) -> Tensor:
    rows, _, seq_len, _ = query.shape
    if seq_len <= QUERY_CHUNK:  # one tile per row: all rows in one call
        return F.scaled_dot_product_attention(query, key, value, attn_mask=segments.rows_mask(), scale=scale, enable_gqa=True)
    out = []
    for row in range(rows):
        chunks = []
        for start in range(0, seq_len, QUERY_CHUNK):
            stop = min(start + QUERY_CHUNK, seq_len)
            keys, mask = segments.tile(row, start, stop)
            chunks.append(F.scaled_dot_product_attention(
                query[row : row + 1, :, start:stop], key[row : row + 1, :, keys], value[row : row + 1, :, keys],
                attn_mask=mask, scale=scale, enable_gqa=True,
            ))
        out.append(torch.cat(chunks, dim=2))
    return torch.cat(out, dim=0)


def segment_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    segments: Segments | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers attention function: `[rows, heads, seq_len, dim]` in, `[rows, seq_len,
    heads, dim]` out. Attends as `segments` says; refuses what it cannot do exactly."""
    name = type(module).__name__
    if segments is None:
        raise ValueError(f"{name}: attention '{SEGMENT_ATTENTION}' needs segments= in the model's forward call")
    if attention_mask is not None:
        raise ValueError(f"{name}: attention '{SEGMENT_ATTENTION}' takes segments=, not an attention_mask")
    if sliding_window is not None:
        raise ValueError(f"{name}: sliding-window attention is not supported by '{SEGMENT_ATTENTION}'")
    if dropout:
        raise ValueError(f"{name}: attention dropout {dropout} is not supported by '{SEGMENT_ATTENTION}'")
    if query.device.type == "cuda":
        out = _compiled_flex_attention()(
            query, key, value, block_mask=segments.block_mask(), scale=scaling, enable_gqa=True
        )
    else:
        out = _chunked_sdpa(query, key, value, segments, scaling)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `SEGMENT_ATTENTION` a transformers `attn_implementation` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
    return SEGMENT_ATTENTION
