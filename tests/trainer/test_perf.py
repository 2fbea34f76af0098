"""Model FLOPs per token and MFU (rlkube.trainer.perf), against a count by hand."""

import pytest
import torch
from rlkube.trainer.perf import Throughput, matmul_params, peak_flops
from transformers import Qwen3Config, Qwen3ForCausalLM


def build(**shape) -> torch.nn.Module:
    with torch.device("meta"):
        return Qwen3ForCausalLM(Qwen3Config(**shape))


TINY = {
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True,
}


def test_flops_per_token_of_a_tiny_qwen3_match_a_count_by_hand():
    model = build(**TINY)
    # per layer: q 64x64, k 64x32, v 64x32, o 64x64 = 12,288; MLP 3 x 64x128 = 24,576
    # two layers: 73,728; the (tied) LM head 100x64 = 6,400. Norms and the embedding lookup: none.
    assert matmul_params(model) == 80_128
    # 6 x 80,128 + causal attention over a 512-token row: 6 x layers 2 x heads 4 x dim 16 x 512
    throughput = Throughput(model, world_size=1, peak=None)
    assert throughput.flops_per_token(512) == 6 * 80_128 + 6 * 2 * 4 * 16 * 512 == 873_984


def test_qwen3_0_6b_counts_what_prime_rl_counts():
    """prime-rl's own test figures for Qwen3-0.6B at 1,024 tokens: 595,984,384 matmul
    parameters, 3,928,227,840 FLOPs per token."""
    model = build(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
    )
    assert matmul_params(model) == 595_984_384
    assert Throughput(model, 1, None).flops_per_token(1024) == 3_928_227_840


def test_mfu_is_per_device_against_the_peak_and_absent_without_one():
    model = build(**TINY)
    flops = Throughput(model, 1, None).flops_per_token(512)
    two = Throughput(model, world_size=2, peak=1e9).metrics(tokens=4000, seconds=2.0, seq_len=512)
    assert two["perf/tokens_per_s"] == 2000
    assert two["perf/mfu"] == pytest.approx(1000 * flops / 1e9)
    assert "perf/mfu" not in Throughput(model, 1, None).metrics(4000, 2.0, 512)


def test_peak_flops_come_from_the_override_or_a_known_gpu():
    assert peak_flops(torch.device("cpu")) is None
    assert peak_flops(torch.device("cpu"), override=2e12) == 2e12


def test_a_pcie_h100_is_not_taken_for_an_sxm_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops(torch.device("cuda")) == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda")) == 989.5e12
