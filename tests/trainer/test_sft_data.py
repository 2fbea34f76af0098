"""SFT data: layouts, role-based loss masks, tools in the template, deterministic batches."""

import json

import pytest
from rlkube.config import SFTDataConfig
from rlkube.trainer.sft.data import ChatTokenizer, SFTBatches, load_rows, row_messages

CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "yo"},
    {"role": "user", "content": "again"},
    {"role": "assistant", "content": "ok"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def trained_text(tokenizer, sample) -> str:
    return tokenizer.decode([t for t, m in zip(sample.input_ids, sample.loss_mask) if m])


def test_assistant_only_mask_trains_on_replies_and_their_end_token(tiny_model, tokenizer):
    sample = ChatTokenizer(tokenizer, str(tiny_model), ["assistant"])({"messages": CHAT})
    full = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert tokenizer.decode(sample.input_ids) == full
    # the replies and the <|im_end|> the model must emit; not the "<|im_start|>assistant\n" scaffold
    assert trained_text(tokenizer, sample) == "yo<|im_end|><think>\n\n</think>\n\nok<|im_end|>"


def test_user_role_can_be_trained_too(tiny_model, tokenizer):
    sample = ChatTokenizer(tokenizer, str(tiny_model), ["user", "assistant"])({"messages": CHAT})
    text = trained_text(tokenizer, sample)
    assert "hi" in text and "again" in text and "Be brief" not in text


def test_prompt_completion_layout_becomes_user_and_assistant_turns(tiny_model, tokenizer):
    row = {"prompt": "abc", "completion": "cba"}
    assert row_messages(row, "auto") == [
        {"role": "user", "content": "abc"},
        {"role": "assistant", "content": "cba"},
    ]
    sample = ChatTokenizer(tokenizer, str(tiny_model), ["assistant"])(row)
    assert trained_text(tokenizer, sample).endswith("cba<|im_end|>")
    messages_row = {"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                    "completion": [{"role": "assistant", "content": "a"}]}
    assert [m["role"] for m in row_messages(messages_row, "prompt_completion")] == ["system", "user", "assistant"]


def test_unknown_layout_names_the_field():
    with pytest.raises(ValueError, match="data.layout"):
        row_messages({"text": "x"}, "auto")


def test_tools_reach_the_chat_template(tiny_model, tokenizer):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    tokenize = ChatTokenizer(tokenizer, str(tiny_model), ["assistant"])
    with_tools = tokenizer.decode(tokenize({"messages": CHAT[1:3], "tools": tools}).input_ids)
    as_json = tokenizer.decode(tokenize({"messages": CHAT[1:3], "tools": json.dumps(tools)}).input_ids)
    assert "get_weather" in with_tools and "<tools>" in with_tools and as_json == with_tools
    assert "get_weather" not in tokenizer.decode(tokenize({"messages": CHAT[1:3]}).input_ids)


def test_local_jsonl_and_parquet_files_load(tmp_path):
    rows = [{"prompt": f"p{i}", "completion": f"c{i}"} for i in range(5)]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    loaded = load_rows(SFTDataConfig(name=str(jsonl)))
    assert [dict(r) for r in loaded] == rows
    import datasets

    datasets.Dataset.from_list(rows).to_parquet(tmp_path / "data.parquet")
    assert load_rows(SFTDataConfig(name=str(tmp_path / "data.parquet")))[3] == rows[3]
    with pytest.raises(ValueError, match="data.name"):
        load_rows(SFTDataConfig(name=str(tmp_path / "missing.jsonl")))


def test_builtin_generator_rows_and_bad_args():
    rows = load_rows(SFTDataConfig(args={"num_examples": 3, "min_len": 4, "max_len": 4}))
    assert len(rows) == 3 and all(len(r["messages"][1]["content"]) == 4 for r in rows)
    with pytest.raises(ValueError, match="data.args"):
        load_rows(SFTDataConfig(args={"nope": 1}))


def _batches(rows, **kwargs):
    defaults = {"batch_size": 4, "seq_len": 64, "rank": 0, "world_size": 1, "seed": 0, "shuffle": True}
    return SFTBatches(rows, lambda r: r, **(defaults | kwargs))


def test_batches_cover_each_epoch_once_and_resume_at_the_same_place():
    rows = list(range(10))
    batches = _batches(rows)
    seen = [batches.next_indices() for _ in range(5)]  # 20 samples: two epochs
    assert sorted(seen[0] + seen[1] + seen[2][:2]) == rows
    assert sorted(seen[2][2:] + seen[3] + seen[4]) == rows
    assert seen[0] + seen[1] != sorted(seen[0] + seen[1])  # shuffled
    resumed = _batches(rows)
    resumed.load_state_dict({"consumed": 8})
    assert [resumed.next_indices() for _ in range(3)] == seen[2:]


def test_ranks_split_each_global_batch_disjointly():
    rows = list(range(16))
    shares = [_batches(rows, rank=r, world_size=2).next_indices()[r::2] for r in range(2)]
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == sorted(_batches(rows).next_indices())
