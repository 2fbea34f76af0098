"""Model FLOPs and MFU (rlkube.trainer.perf), against counts by hand and prime-rl's figures."""

import pytest
import torch
from rlkube.trainer.perf import Throughput, matmul_params, peak_flops
from rlkube.trainer.rl.attention import visible_pairs
from transformers import Qwen3Config, Qwen3ForCausalLM


def build(**shape) -> torch.nn.Module:
    with torch.device("meta"):
        return Qwen3ForCausalLM(Qwen3Config(**shape))


TINY = {
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True,
}


def test_a_packed_micro_batch_counts_the_attention_its_mask_computes():
    model = build(**TINY)
    # per layer: q 64x64, k 64x32, v 64x32, o 64x64 = 12,288; MLP 3 x 64x128 = 24,576
    # two layers: 73,728; the (tied) LM head 100x64 = 6,400. Norms and the embedding lookup: none.
    assert matmul_params(model) == 80_128
    # a 32-token row: a 10-token sample, a 6-token one, 16 padding; then a row of padding
    sample_ids = torch.tensor([[0] * 10 + [1] * 6 + [-1] * 16, [-1] * 32], dtype=torch.int32)
    tokens, pairs = 16, visible_pairs(sample_ids, torch.full_like(sample_ids, -1))
    assert pairs == 10 * 11 // 2 + 6 * 7 // 2 == 76  # causal within each sample; padding not counted
    throughput = Throughput(model, world_size=1, peak=1e9)
    # 6 x 80,128 per token; QK^T and PV: 2 x 2 FLOPs x 4 heads x 16 dims per pair, x3, x 2 layers
    assert throughput.flops(tokens, pairs) == 6 * 80_128 * 16 + 12 * 4 * 16 * 2 * 76 == 7_809_024
    # prime-rl: 12 x 2 layers x hidden 64 per pair, every token seeing the whole 32-token row
    assert throughput.primerl_flops_per_token(32) == 6 * 80_128 + 12 * 2 * 64 * 32 == 529_920
    mfu = throughput.metrics(tokens, pairs, seconds=2.0, seq_len=32)
    assert mfu["perf/mfu"] == pytest.approx(7_809_024 / 2 / 1e9)
    assert mfu["perf/mfu_primerl"] == pytest.approx(16 * 529_920 / 2 / 1e9)


def test_qwen3_0_6b_counts_what_prime_rl_counts():
    """prime-rl's own test figures for Qwen3-0.6B at 1,024 tokens (595,984,384 matmul
    parameters, 3,928,227,840 FLOPs per token), and the MFU of its published single-H100 figure
    at 16k-token rows: 11.9k tokens/s, 11.1 % (against its 989 TFLOP/s peak)."""
    model = build(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
    )
    assert matmul_params(model) == 595_984_384
    throughput = Throughput(model, 1, 989e12)
    assert throughput.primerl_flops_per_token(1024) == 3_928_227_840
    assert throughput.metrics(11_900, 0, 1.0, 16_384)["perf/mfu_primerl"] == pytest.approx(0.111, abs=5e-4)


def test_mfu_is_per_device_against_the_peak_and_absent_without_one():
    model = build(**TINY)
    flops = Throughput(model, 1, None).flops(4000, 10**6)
    two = Throughput(model, world_size=2, peak=1e9).metrics(tokens=4000, attention_pairs=10**6, seconds=2.0, seq_len=512)
    assert two["perf/tokens_per_s"] == 2000
    assert two["perf/mfu"] == pytest.approx(flops / 2 / 2 / 1e9)
    assert not {"perf/mfu", "perf/mfu_primerl"} & Throughput(model, 1, None).metrics(4000, 10**6, 2.0, 512).keys()


def test_peak_flops_come_from_the_override_or_a_known_gpu():
    assert peak_flops(torch.device("cpu")) is None
    assert peak_flops(torch.device("cpu"), override=2e12) == 2e12


def test_a_pcie_h100_is_not_taken_for_an_sxm_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 PCIe")
    assert peak_flops(torch.device("cuda")) == 756e12
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert peak_flops(torch.device("cuda")) == 989.5e12
