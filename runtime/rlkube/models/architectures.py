"""A model's architecture (its `config.json`) without its weights, and without a network.

The meta-device build (`rlkube.trainer.model.build_meta_model`: LoRA target checks, the memory
estimate of `--dry-run`) needs only `config.json`. It is read from, in order: the model's local
directory; the Hugging Face cache (a model downloaded before); `KNOWN`, the architectures of
the models `configs/` names, so those configs check and estimate offline (CI has no network);
and only then the Hub, which downloads `config.json` alone.
"""

from pathlib import Path

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "attention_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 151643, "eos_token_id": 151645,
}
KNOWN = {
    "Qwen/Qwen3-0.6B": _QWEN3 | {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                                "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "Qwen/Qwen3-1.7B": _QWEN3 | {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                                "num_attention_heads": 16, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "Qwen/Qwen3-4B": _QWEN3 | {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                              "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": True},
    "Qwen/Qwen3-8B": _QWEN3 | {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                              "num_attention_heads": 32, "num_key_value_heads": 8, "tie_word_embeddings": False},
    "Qwen/Qwen3-30B-A3B": _QWEN3 | {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "tie_word_embeddings": False, "num_experts": 128,
        "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
        "router_aux_loss_coef": 0.001, "output_router_logits": False},
}
"""The `config.json` fields that shape these Hub models (their published values; the Hub's files
are what a run trains, this is only for building them on the meta device offline).
`tests/models/test_architectures.py` checks each against the model card's parameter count."""


def model_architecture(name: str, trust_remote_code: bool = False):
    """The transformers config of model `name` (a local directory or a hub id)."""
    from transformers import AutoConfig

    if Path(name).expanduser().is_dir():
        return AutoConfig.from_pretrained(Path(name).expanduser(), trust_remote_code=trust_remote_code)
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code, local_files_only=True)
    except OSError:
        pass
    if name in KNOWN:
        known = dict(KNOWN[name])
        return AutoConfig.for_model(known.pop("model_type"), **known)
    return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
