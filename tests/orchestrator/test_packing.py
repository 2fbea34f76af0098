import pytest
import torch
from rlkube.orchestrator.packing import pack_batch, pack_rows

from tests.orchestrator.helpers import make_sample


def test_first_fit_decreasing_rows():
    samples = [make_sample(2, 3), make_sample(4, 4), make_sample(1, 1), make_sample(3, 3)]  # 5, 8, 2, 6 tokens
    rows = pack_rows(samples, seq_len=10)
    assert [[len(s.token_ids) for s in row] for row in rows] == [[8, 2], [6], [5]]


def test_row_layout():
    a = make_sample(2, 3, advantage=0.5, temperature=0.7)  # 5 tokens
    b = make_sample(1, 2, advantage=-1.0, temperature=0.7)  # 3 tokens
    (rank0,) = pack_batch([a, b], seq_len=10, world_size=1)
    (mb,) = rank0
    assert mb["input_ids"].shape == (1, 10)
    assert mb["input_ids"][0, :8].tolist() == a.token_ids + b.token_ids
    assert mb["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0]
    assert mb["sample_ids"][0].tolist() == [0] * 5 + [1] * 3 + [-1] * 2
    assert mb["loss_mask"][0].tolist() == [False, False, True, True, True, False, True, True, False, False]
    assert mb["advantages"][0].tolist() == [0, 0, 0.5, 0.5, 0.5, 0, -1.0, -1.0, 0, 0]
    assert mb["inference_logprobs"][0].tolist() == [0, 0, -0.5, -0.5, -0.5, 0, -0.5, -0.5, 0, 0]
    assert mb["temperatures"][0, :8].tolist() == pytest.approx([0.7] * 8)
    assert mb["global_loss_tokens"] == 5


def test_long_sample_is_truncated_to_seq_len():
    (rank0,) = pack_batch([make_sample(4, 20)], seq_len=8, world_size=1)
    assert rank0[0]["input_ids"].shape == (1, 8)
    assert rank0[0]["global_loss_tokens"] == 4


@pytest.mark.parametrize("world_size, micro_batch_rows", [(2, 1), (3, 1), (2, 2), (4, 3)])
def test_ranks_get_equal_row_counts_and_balanced_tokens(world_size, micro_batch_rows):
    lengths = [(3, 5), (2, 9), (1, 1), (4, 4), (2, 2), (6, 1), (1, 7), (5, 5), (2, 3)]
    samples = [make_sample(p, c) for p, c in lengths]
    ranks = pack_batch(samples, seq_len=12, world_size=world_size, micro_batch_rows=micro_batch_rows)
    assert len(ranks) == world_size
    counts = {len(r) for r in ranks}
    assert len(counts) == 1, "every rank must run the same number of micro-batches"
    assert all(mb["input_ids"].shape == (micro_batch_rows, 12) for r in ranks for mb in r)
    # every sample lands exactly once
    tokens = torch.cat([mb["input_ids"][mb["sample_ids"] >= 0] for r in ranks for mb in r])
    assert sorted(tokens.tolist()) == sorted(t for s in samples for t in s.token_ids)
    # global loss tokens: the true total, identical on every micro-batch of every rank
    total = sum(c for _, c in lengths)
    assert {mb["global_loss_tokens"] for r in ranks for mb in r} == {total}
    assert sum(int(mb["loss_mask"].sum()) for r in ranks for mb in r) == total
    per_rank = [sum(int((mb["sample_ids"] >= 0).sum()) for mb in r) for r in ranks]
    assert max(per_rank) - min(per_rank) <= 12, f"unbalanced: {per_rank}"


def test_no_samples_still_gives_every_rank_one_padding_micro_batch():
    ranks = pack_batch([], seq_len=6, world_size=2)
    assert [len(r) for r in ranks] == [1, 1]
    assert all(not mb["loss_mask"].any() and mb["global_loss_tokens"] == 0 for r in ranks for mb in r)
