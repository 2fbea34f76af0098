"""Sequence packing: positions restart per sample, targets and loss never cross samples."""

import pytest
import torch
from rlkube.trainer.packing import Sample, collate, empty_row_batch, pack


def test_samples_fill_rows_in_order_first_fit():
    samples = [Sample([1] * 5, [True] * 5), Sample([2] * 4, [True] * 4), Sample([3] * 3, [True] * 3)]
    rows = pack(samples, seq_len=8)
    assert [r.input_ids for r in rows] == [[1] * 5 + [3] * 3, [2] * 4]


def test_positions_restart_and_targets_shift_within_each_sample():
    rows = pack([Sample([10, 11, 12], [False, True, True]), Sample([20, 21], [False, True])], seq_len=8)
    (row,) = rows
    assert row.position_ids == [0, 1, 2, 0, 1]
    assert row.target_ids == [11, 12, 0, 21, 0]
    # token i's target is token i+1 of the same sample; the last token of a sample predicts nothing
    assert row.target_mask == [True, True, False, True, False]


def test_long_samples_are_truncated_to_seq_len():
    (row,) = pack([Sample(list(range(10)), [True] * 10)], seq_len=4)
    assert row.input_ids == [0, 1, 2, 3] and row.target_mask == [True, True, True, False]


def test_collate_pads_without_loss():
    batch = collate(pack([Sample([5, 6, 7], [True] * 3)], seq_len=6), seq_len=6, pad_id=99)
    assert batch["input_ids"].tolist() == [[5, 6, 7, 99, 99, 99]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2]]
    assert batch["loss_mask"].tolist() == [[True, True, False, False, False, False]]
    assert batch["target_ids"][0, :2].tolist() == [6, 7]


def test_empty_rows_carry_no_loss():
    batch = empty_row_batch(2, 8, pad_id=1)
    assert batch["input_ids"].shape == (2, 8) and not batch["loss_mask"].any()


def test_mismatched_mask_is_rejected():
    with pytest.raises(ValueError, match="differ in length"):
        Sample([1, 2], [True])


def test_packed_samples_do_not_attend_to_each_other(tiny_model):
    """The logits of a sample are the same alone and packed after another sample (as the
    trainer calls the model: position_ids, no attention mask, no KV cache)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    a, b = [5, 6, 7, 8, 9], [40, 41, 42, 43]
    batch = collate(pack([Sample(a, [True] * 5), Sample(b, [True] * 4)], seq_len=12), 12, pad_id=0)
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        alone = model(input_ids=torch.tensor([b])).logits
    torch.testing.assert_close(packed[0, 5:9], alone[0], rtol=1e-4, atol=1e-4)
    # and the check has teeth: without restarted positions the logits differ
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"], use_cache=False).logits
    assert not torch.allclose(leaky[0, 5:9], alone[0], atol=1e-3)
