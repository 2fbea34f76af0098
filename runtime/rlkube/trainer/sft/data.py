"""SFT data: load a chat dataset, tokenize with role-based loss masks, batch deterministically.

Rows come in one of two layouts: `messages` (a list of chat turns) or `prompt`/`completion`
(each a string or a list of turns). An optional `tools` column holds tool definitions for
the chat template. Tokens are attributed to messages by the `renderers` package (Qwen3's
hand-written renderer for Qwen3-templated models, else its `apply_chat_template` fallback),
so the loss mask follows roles exactly: a token is trained on when its message's role is in
`data.loss_roles`, and, for assistant turns, when the model would have sampled it (not the
`<|im_start|>assistant\n` scaffold).
"""

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlkube.config import SFTDataConfig
from rlkube.trainer.packing import Sample, pack

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(config: SFTDataConfig) -> Sequence[dict]:
    """The dataset's rows: a built-in generator, a local file or saved dataset, or a hub id."""
    if config.name == "reverse_text":
        from rlkube.envs.reverse_text import sft_examples

        try:
            return sft_examples(split=config.split, **config.args)
        except TypeError as e:
            raise ValueError(f"data.args: {e}") from None
    import datasets

    path = Path(config.name)
    if path.suffix in FILE_FORMATS:
        if not path.is_file():
            raise ValueError(f"data.name: file {path} does not exist")
        return datasets.load_dataset(FILE_FORMATS[path.suffix], data_files=str(path), split="train")
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        return loaded[config.split] if isinstance(loaded, datasets.DatasetDict) else loaded
    return datasets.load_dataset(config.name, split=config.split)


def _as_messages(value: Any, role: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    return list(value)


def row_messages(row: dict, layout: str) -> list[dict]:
    """A row as one list of chat messages, per `layout` (`auto` decides by the columns)."""
    if layout == "auto":
        if "messages" in row:
            layout = "messages"
        elif "prompt" in row and "completion" in row:
            layout = "prompt_completion"
        else:
            raise ValueError(
                f"data.layout: cannot tell the layout from columns {sorted(row)}; "
                "need 'messages' or 'prompt' and 'completion'"
            )
    if layout == "messages":
        return list(row["messages"])
    return _as_messages(row["prompt"], "user") + _as_messages(row["completion"], "assistant")


def _row_tools(row: dict) -> list[dict] | None:
    tools = row.get("tools")
    if isinstance(tools, str):  # tools stored as a JSON string (common in parquet)
        tools = json.loads(tools)
    return tools or None


class ChatTokenizer:
    """Rows to `Sample`s: token ids and the role-based loss mask."""

    def __init__(self, tokenizer, model_name: str, loss_roles: Sequence[str], layout: str = "auto") -> None:
        from renderers import create_renderer

        from rlkube.models.renderer import renderer_config_for

        self.renderer = create_renderer(tokenizer, renderer_config_for(model_name))
        self.loss_roles = set(loss_roles)
        self.layout = layout

    def __call__(self, row: dict) -> Sample:
        messages = row_messages(row, self.layout)
        rendered = self.renderer.render(messages, tools=_row_tools(row))
        roles = rendered.message_roles
        sampled = rendered.sampled_mask or [True] * len(rendered.token_ids)
        mask = []
        for index, was_sampled in zip(rendered.message_indices, sampled):
            role = roles[index] if index >= 0 else ""
            mask.append(role in self.loss_roles and (was_sampled or role != "assistant"))
        return Sample(list(rendered.token_ids), mask)


class SFTBatches:
    """Deterministic global batches: `batch_size` samples per step from a seeded permutation
    per epoch; each rank packs its share (`rank::world_size`) into `seq_len` rows.

    The position (`consumed` samples) is checkpointed, so a resumed run sees the same data.
    """

    def __init__(self, rows: Sequence[dict], tokenize, *, batch_size: int, seq_len: int,
                 rank: int, world_size: int, seed: int, shuffle: bool) -> None:
        if len(rows) == 0:
            raise ValueError("data: the dataset is empty")
        self.rows, self.tokenize = rows, tokenize
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.consumed = 0

    def _order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_indices(self) -> list[int]:
        """The next global batch's row indices (crossing epochs as needed)."""
        indices: list[int] = []
        n = len(self.rows)
        while len(indices) < self.batch_size:
            epoch, offset = divmod(self.consumed, n)
            take = min(self.batch_size - len(indices), n - offset)
            indices += self._order(epoch)[offset : offset + take]
            self.consumed += take
        return indices

    def next_rows(self):
        """This rank's packed rows of the next step."""
        mine = self.next_indices()[self.rank :: self.world_size]
        return pack([self.tokenize(self.rows[i]) for i in mine], self.seq_len)

    def state_dict(self) -> dict[str, int]:
        return {"consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.consumed = int(state["consumed"])


class FakeBatches:
    """Benchmark data: random tokens, every token trained on; no tokenizer, no dataset."""

    def __init__(self, *, batch_size: int, seq_len: int, vocab_size: int, rank: int, world_size: int, seed: int) -> None:
        self.rng = random.Random(f"{seed}/{rank}")
        self.per_rank = max(1, batch_size // world_size)
        self.seq_len, self.vocab_size = seq_len, vocab_size

    def next_rows(self):
        length = max(2, self.seq_len // 4)
        samples = [
            Sample([self.rng.randrange(self.vocab_size) for _ in range(length)], [True] * length)
            for _ in range(self.per_rank)
        ]
        return pack(samples, self.seq_len)

    def state_dict(self) -> dict[str, int]:
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass
