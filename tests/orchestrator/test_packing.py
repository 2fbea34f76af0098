import json

import numpy as np
import pytest
import torch
from rlkube.orchestrator.packing import pack_batch, pack_rows
from rlkube.rollout_types import Rollout, Sample

from tests.orchestrator.helpers import make_rollout, make_sample


def test_first_fit_decreasing_rows():
    samples = [make_sample(2, 3), make_sample(4, 4), make_sample(1, 1), make_sample(3, 3)]  # 5, 8, 2, 6 tokens
    rows = pack_rows(samples, seq_len=10)
    assert [[block.num_tokens for block in row] for row in rows] == [[8, 2], [6], [5]]
    assert all(block.prefix_len == 0 for row in rows for block in row), "distinct prompts share nothing"


def test_row_layout():
    a = make_sample(2, 3, advantage=0.5, temperature=0.7)  # 5 tokens
    b = make_sample(1, 2, advantage=-1.0, temperature=0.7)  # 3 tokens
    (rank0,) = pack_batch([a, b], seq_len=10, world_size=1)
    (mb,) = rank0
    assert mb["input_ids"].shape == (1, 10)
    assert mb["input_ids"][0, :8].tolist() == a.token_ids + b.token_ids
    assert mb["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 0, 0]
    assert mb["sample_ids"][0].tolist() == [0] * 5 + [1] * 3 + [-1] * 2
    assert mb["prefix_ids"][0].tolist() == [-1] * 10
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
    ranks = pack_batch(samples, seq_len=12, world_size=world_size, micro_batch_rows=micro_batch_rows, share_prompts=False)
    assert len(ranks) == world_size
    counts = {len(r) for r in ranks}
    assert len(counts) == 1, "every rank must run the same number of micro-batches"
    assert len({sum(mb["input_ids"].shape[0] for mb in r) for r in ranks}) == 1, "and the same number of rows"
    assert all(mb["input_ids"].shape[0] <= micro_batch_rows and mb["input_ids"].shape[1] == 12 for r in ranks for mb in r)
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


def make_group(prompt: list[int], completions: list[list[int]], first_advantage: float = 0.1) -> list[Sample]:
    return [
        Sample(
            token_ids=prompt + c, loss_mask=[False] * len(prompt) + [True] * len(c),
            logprobs=[0.0] * len(prompt) + [-0.25] * len(c), temperature=0.7, advantage=first_advantage * (i + 1),
        )
        for i, c in enumerate(completions)
    ]


def test_a_group_shares_one_copy_of_its_prompt():
    group = make_group([1, 2, 3], [[10, 11], [20, 21, 22]])
    alone = make_sample(2, 1)  # another prompt: not shared
    (rank0,) = pack_batch(group + [alone], seq_len=12, world_size=1)
    (mb,) = rank0
    assert mb["input_ids"][0].tolist() == [1, 2, 3, 20, 21, 22, 10, 11, 100, 101, 102, 0]
    # segments: the two samples (0, 1), the lone sample (2), the shared prompt after all samples (3)
    assert mb["sample_ids"][0].tolist() == [3, 3, 3, 0, 0, 0, 1, 1, 2, 2, 2, -1]
    assert mb["prefix_ids"][0].tolist() == [-1, -1, -1, 3, 3, 3, 3, 3, -1, -1, -1, -1]
    assert mb["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 0, 1, 2, 0]
    assert mb["loss_mask"][0].tolist() == [False] * 3 + [True] * 5 + [False, False, True, False]
    assert mb["advantages"][0, 3:8].tolist() == pytest.approx([0.2] * 3 + [0.1] * 2)
    assert mb["global_loss_tokens"] == 6


def test_a_group_too_long_for_one_row_repeats_its_prompt_in_each():
    completions = [[10 * i + j for j in range(4)] for i in range(1, 6)]  # 5 samples of 3 + 4 tokens
    (rank0,) = pack_batch(make_group([1, 2, 3], completions), seq_len=12, world_size=1, micro_batch_rows=4)
    (mb,) = rank0
    rows = [row[row_ids >= 0].tolist() for row, row_ids in zip(mb["input_ids"], mb["sample_ids"])]
    assert [row[:3] for row in rows] == [[1, 2, 3]] * 3, "each row starts with the prompt"
    assert sorted(t for row in rows for t in row[3:]) == sorted(t for c in completions for t in c)
    assert int(mb["loss_mask"].sum()) == mb["global_loss_tokens"] == 20


def test_prompts_are_not_shared_when_off_or_when_nothing_is_gained():
    group = make_group([1, 2, 3], [[10, 11], [20, 21, 22]])
    (rank0,) = pack_batch(group, seq_len=12, world_size=1, share_prompts=False)
    assert (rank0[0]["prefix_ids"] == -1).all() and int((rank0[0]["sample_ids"] >= 0).sum()) == 11
    untrained = Sample(token_ids=[1, 2, 3], loss_mask=[False] * 3, logprobs=[0.0] * 3, temperature=1.0)
    (blocks,) = pack_rows([untrained, *make_group([1, 2, 3], [[9]])], seq_len=12)
    assert [b.prefix_len for b in blocks] == [0, 0], "a sample with nothing after the prompt shares nothing"
    hot, cold = make_group([1, 2, 3], [[10, 11], [20, 21]])
    cold.temperature = 1.0
    (blocks,) = pack_rows([hot, cold], seq_len=12)
    assert [b.prefix_len for b in blocks] == [0, 0], "samples drawn at different temperatures share nothing"


def test_a_ranks_last_micro_batch_is_not_padded_to_full_size():
    samples = [make_sample(1, 5) for _ in range(5)]  # 6 tokens each, one per row of 8
    (rank0,) = pack_batch(samples, seq_len=8, world_size=1, micro_batch_rows=2, share_prompts=False)
    assert [mb["input_ids"].shape[0] for mb in rank0] == [2, 2, 1]



def teacher_scored(sample: Sample, first_token: int) -> Sample:
    """`sample` renumbered to unique token ids from `first_token` (its prompt too), with the
    teacher log-prob -token/1000 on each loss token and 0.0 elsewhere."""
    sample.token_ids = list(range(first_token, first_token + len(sample.token_ids)))
    sample.teacher_logprobs = [-t / 1000 if m else 0.0 for t, m in zip(sample.token_ids, sample.loss_mask)]
    return sample


def test_teacher_logprobs_travel_with_their_tokens():
    """A group sharing one prompt copy, and a sample cut to seq_len: each loss token keeps its
    own teacher log-prob, everything else (the shared prompt, padding) is 0."""
    group = [teacher_scored(make_sample(3, 2), 100), teacher_scored(make_sample(3, 4), 100)]
    group[1].token_ids[3:] = [200, 201, 202, 203]  # same prompt, own completion
    group[1].teacher_logprobs[3:] = [-0.2, -0.201, -0.202, -0.203]
    long = teacher_scored(make_sample(2, 20), 300)
    (rank0,) = pack_batch([*group, long], seq_len=12, world_size=1, micro_batch_rows=2)
    (mb,) = rank0
    mask, teacher, tokens = mb["loss_mask"], mb["teacher_logprobs"], mb["input_ids"]
    assert teacher.dtype == torch.float32 and teacher.shape == mask.shape
    assert int(mask.sum()) == 2 + 4 + 10, "the group shares its prompt, the long sample is cut"
    assert (tokens[mb["prefix_ids"] >= 0] < 300).all(), "the group is packed on one prompt copy"
    assert teacher[mask].tolist() == pytest.approx((-tokens[mask] / 1000).tolist())
    assert not teacher[~mask].any(), "0 off the loss tokens"


def test_teacher_logprobs_only_when_every_sample_has_them():
    (rank0,) = pack_batch([make_sample(2, 2)], seq_len=8, world_size=1)
    assert "teacher_logprobs" not in rank0[0]
    with pytest.raises(ValueError, match="some samples of the step have teacher_logprobs"):
        pack_batch([make_sample(2, 2), teacher_scored(make_sample(2, 3), 100)], seq_len=8, world_size=1)


def routed(sample: Sample, first_token: int) -> Sample:
    """`sample` renumbered from `first_token`, each token routed to experts (token, token + 1)
    in both of 2 MoE layers, as inference would report."""
    sample.token_ids = list(range(first_token, first_token + len(sample.token_ids)))
    ids = np.array(sample.token_ids, dtype=np.int16)
    sample.routed_experts = np.stack([ids, ids + 1], axis=-1)[:, None, :].repeat(2, axis=1)
    return sample


def test_routed_experts_travel_with_their_tokens_and_are_unknown_elsewhere():
    """A group sharing one prompt copy, a sample cut to seq_len and one whose engine answer
    had no routing: every token keeps its own experts; padding and the routing-less sample
    get -1 (the trainer's own routing)."""
    group = [routed(make_sample(3, 2), 100), routed(make_sample(3, 4), 100)]
    group[1].token_ids[3:] = [200, 201, 202, 203]
    group[1].routed_experts[3:] = np.array([[t, t + 1] for t in range(200, 204)])[:, None, :]
    long, plain = routed(make_sample(2, 20), 300), make_sample(1, 2)
    plain.token_ids = [1, 2, 3]  # ids below 100: routing unknown
    (rank0,) = pack_batch([*group, long, plain], seq_len=12, world_size=1, micro_batch_rows=4)
    experts = torch.cat([mb["routed_experts"] for mb in rank0])
    tokens, segments = torch.cat([mb["input_ids"] for mb in rank0]), torch.cat([mb["sample_ids"] for mb in rank0])
    assert experts.dtype == torch.int16 and experts.shape == (*tokens.shape, 2, 2)
    known = tokens >= 100
    assert torch.equal(experts[known][:, 0, 0].long(), tokens[known]) and torch.equal(experts[known][:, 1, 1].long(), tokens[known] + 1)
    assert (experts[~known] == -1).all() and (experts[segments < 0] == -1).all()


def test_routed_experts_survive_the_orchestrator_checkpoint():
    rollout = make_rollout(1.0)
    rollout.samples = [routed(rollout.samples[0], 100), make_sample(1, 1)]
    back = Rollout.from_dict(json.loads(json.dumps(rollout.to_dict())))
    assert np.array_equal(back.samples[0].routed_experts, rollout.samples[0].routed_experts)
    assert back.samples[0].routed_experts.dtype == np.int16 and back.samples[1].routed_experts is None
