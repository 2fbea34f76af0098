"""The tiny model: loadable by transformers, Qwen3 tokens and template, picked by renderers."""

import json

import pytest
from rlkube.entrypoints.model import main as model_main
from rlkube.models.renderer import renderer_config_for, renderer_name_for
from rlkube.models.tiny import QWEN3_ADDED_TOKENS, qwen3_chat_template

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]

CONVERSATIONS = [
    [{"role": "system", "content": "Reverse the text."}, {"role": "user", "content": "abc"}],
    [
        {"role": "system", "content": "Reverse the text."},
        {"role": "user", "content": "Hello, World!\n"},
        {"role": "assistant", "content": "\n!dlroW ,olleH"},
    ],
    [
        {"role": "user", "content": "What is 'x'?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"word": "x"}}}],
        },
        {"role": "tool", "content": "a letter"},
        {"role": "assistant", "content": "<think>\nok\n</think>\n\nA letter."},
    ],
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def test_model_loads_with_expected_shape(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    config = model.config
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (config.num_hidden_layers, config.hidden_size) == (4, 256)
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 5_000_000


def test_tokenizer_has_qwen3_special_tokens(tokenizer):
    for token, _ in QWEN3_ADDED_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1, token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"


def test_tokenizer_is_character_level_and_lossless(tokenizer):
    text = "The quick brown fox, 42 times!\n\t{\"a\": [1]} ~ end"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == len(text)  # one token per ASCII character
    assert tokenizer.decode(ids) == text
    unicode_text = "naïve – 日本"
    assert tokenizer.decode(tokenizer.encode(unicode_text, add_special_tokens=False)) == unicode_text


def test_skip_special_tokens_keeps_think_and_tool_tags(tokenizer):
    ids = tokenizer.encode("<|im_start|><think>x</think><tool_call><|im_end|>", add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call>"


def test_chat_template_is_qwen3s(tokenizer):
    assert tokenizer.chat_template == qwen3_chat_template()
    text = tokenizer.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>system\nReverse the text.<|im_end|>\n<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\n"


def test_renderers_picks_the_qwen3_renderer(tiny_model):
    from renderers import create_renderer
    from renderers.base import load_tokenizer
    from renderers.qwen3 import Qwen3Renderer

    assert renderer_name_for(tiny_model) == "qwen3"
    renderer = create_renderer(load_tokenizer(str(tiny_model)), renderer_config_for(tiny_model))
    assert isinstance(renderer, Qwen3Renderer)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_qwen3_renderer_matches_chat_template_token_for_token(tiny_model, tokenizer, conversation, tools):
    from renderers import create_renderer

    renderer = create_renderer(tokenizer, renderer_config_for(tiny_model))
    generation = conversation[-1]["role"] != "assistant"
    expected = tokenizer.apply_chat_template(
        conversation, tools=tools, add_generation_prompt=generation, tokenize=False
    )
    rendered = renderer.render_ids(conversation, tools=tools, add_generation_prompt=generation)
    assert list(rendered) == tokenizer.encode(expected, add_special_tokens=False)


def test_renderer_name_recognizes_a_copied_qwen3_template(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": qwen3_chat_template()}))
    assert renderer_name_for(tmp_path) == "qwen3"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert renderer_name_for(tmp_path) is None
    assert renderer_name_for("Qwen/Qwen3-0.6B") is None  # hub ids: renderers resolves them


def test_cli_writes_a_model_with_the_requested_shape(tmp_path):
    from transformers import AutoConfig

    assert model_main(["init", "--out", str(tmp_path / "m"), "--layers", "2", "--hidden", "64"]) == 0
    config = AutoConfig.from_pretrained(tmp_path / "m")
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim) == (2, 64, 16)


def test_cli_rejects_shapes_that_do_not_divide(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        model_main(["init", "--out", str(tmp_path / "m"), "--hidden", "65"])
    assert exit_info.value.code == 2
    assert "hidden (65) must be a multiple of heads (4)" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_moe_model_routes_each_token_to_top_k_of_its_experts(tiny_moe_model, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_moe_model)
    config = model.config
    assert type(model).__name__ == "Qwen3MoeForCausalLM"
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (4, 2, 256)
    assert config.mlp_only_layers == [] and config.decoder_sparse_step == 1  # every layer is sparse
    assert 1_000_000 < sum(p.numel() for p in model.parameters()) < 5_000_000
    moe_tokenizer = AutoTokenizer.from_pretrained(tiny_moe_model)
    assert moe_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert moe_tokenizer.chat_template == tokenizer.chat_template
    ids = torch.tensor([tokenizer.encode("Hello, World!", add_special_tokens=False)])
    with torch.no_grad():
        out = model(ids, output_router_logits=True)
    assert torch.isfinite(out.logits).all()
    chosen = torch.cat([logits.topk(2, dim=-1).indices.flatten() for logits in out.router_logits])
    assert len(chosen.unique()) > 2  # the untrained router spreads tokens over more than k experts


def test_cli_moe_writes_per_expert_weights_and_the_qwen3_renderer(tmp_path):
    from safetensors import safe_open
    from transformers import AutoConfig

    out = tmp_path / "m"
    argv = ["init", "--moe", "--out", str(out), "--layers", "1", "--hidden", "64", "--experts", "3",
            "--experts-per-token", "1", "--intermediate", "32"]
    assert model_main(argv) == 0
    config = AutoConfig.from_pretrained(out)
    assert (config.model_type, config.num_experts, config.num_experts_per_tok) == ("qwen3_moe", 3, 1)
    # Hugging Face's checkpoint layout (what vLLM's and the trainer's loaders read): one tensor per expert.
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = f.keys()
        experts = [name for name in names if ".mlp.experts." in name]
        assert f.get_tensor("model.layers.0.mlp.experts.2.gate_proj.weight").shape == (32, 64)
    assert len(experts) == 3 * 3
    assert renderer_name_for(out) == "qwen3"


def test_cli_rejects_more_active_experts_than_experts(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        model_main(["init", "--moe", "--out", str(tmp_path / "m"), "--experts", "2", "--experts-per-token", "3"])
    assert exit_info.value.code == 2
    assert "experts_per_token (3) exceeds experts (2)" in capsys.readouterr().err
