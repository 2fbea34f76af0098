"""Tiny Qwen3 models for tests and examples: no download, a few million parameters.

The model is a real `Qwen3ForCausalLM` (or, with `moe=True`, a real `Qwen3MoeForCausalLM`:
every layer's MLP is a few experts with top-k routing) and its tokenizer carries Qwen3's special tokens and
chat template, so everything that special-cases Qwen3 (vLLM, the `renderers` package's
hand-written Qwen3 renderer used by verifiers' training client) treats it like a real one.
The vocabulary is the 256 byte symbols of a byte-level BPE with no merges: one token per
ASCII character, any other text still encodes (as UTF-8 bytes), and nothing is ever unknown.

    rlkube model init --out outputs/reverse_text/model
    rlkube model init --moe --out outputs/reverse_text/model_moe
"""

import json
from importlib import resources
from pathlib import Path

# Qwen3's added tokens in Qwen3's order. `True` marks the ones Qwen3 flags `special`
# (dropped by `skip_special_tokens`); tool and think tags stay visible in decoded text.
QWEN3_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"


def qwen3_chat_template() -> str:
    """Qwen3's chat template (as shipped with Qwen/Qwen3-0.6B)."""
    return resources.files("rlkube.models").joinpath("qwen3_chat_template.jinja").read_text()


def build_tokenizer():
    """A byte-level tokenizer (one token per byte, no merges) with Qwen3's added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_symbols = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda s: ord(s))
    vocab = {symbol: i for i, symbol in enumerate(byte_symbols)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_tokens(
        [AddedToken(t, special=s, normalized=False) for t, s in QWEN3_ADDED_TOKENS]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=qwen3_chat_template(),
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )


def init_tiny_model(
    out_dir: str | Path,
    *,
    layers: int = 4,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    max_position_embeddings: int = 4096,
    moe: bool = False,
    experts: int = 4,
    experts_per_token: int = 2,
    seed: int = 0,
) -> Path:
    """Write an untrained Qwen3 with the byte-level Qwen3 tokenizer to `out_dir`.

    Dense (`Qwen3ForCausalLM`): `intermediate` defaults to 2 * `hidden`; the defaults give
    about 2.4M parameters. MoE (`Qwen3MoeForCausalLM`, `moe=True`): each layer has `experts`
    experts of width `intermediate` (default `hidden`), `experts_per_token` of them active
    per token, so with the defaults a token costs what it costs in the dense model; about
    4.0M parameters.
    """
    if experts_per_token > experts:
        raise ValueError(f"experts_per_token ({experts_per_token}) exceeds experts ({experts})")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be divisible by heads ({heads})")
    if heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    import torch
    from transformers import (
        GenerationConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    if moe:
        config_class, model_class = Qwen3MoeConfig, Qwen3MoeForCausalLM
        shape = {
            "moe_intermediate_size": intermediate or hidden,
            "num_experts": experts,
            "num_experts_per_tok": experts_per_token,
            "norm_topk_prob": True,  # as Qwen3-30B-A3B
        }
    else:
        config_class, model_class = Qwen3Config, Qwen3ForCausalLM
        shape = {"intermediate_size": intermediate or 2 * hidden}
    config = config_class(
        vocab_size=-(-len(tokenizer) // 64) * 64,  # padded, as real checkpoints are
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
        **shape,
    )
    torch.manual_seed(seed)
    model = model_class(config)
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, bos_token_id=None
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "rlkube_model.json").write_text(json.dumps({"renderer": "qwen3"}, indent=2) + "\n")
    return out
