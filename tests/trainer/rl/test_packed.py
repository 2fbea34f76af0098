"""Packed rows in the trainer: masks, predictors and log-probs, and that sharing a group's
prompt changes the cost but not the log-probs or the gradients."""

import math
import random

import pytest
import torch
from rlkube.orchestrator.packing import pack_batch
from rlkube.rollout_types import Sample
from rlkube.trainer.rl.attention import SEGMENT_ATTENTION, Segments, register, visible_pairs
from rlkube.trainer.rl.packed import policy_logprobs, token_logprobs


def test_visibility_and_predictors_of_a_shared_prompt_a_plain_sample_and_padding():
    # prompt (segment 5), two samples continuing it (0, 1), a plain sample (2), padding
    sample_ids = torch.tensor([[5, 5, 0, 0, 1, 1, 2, 2, -1, -1]], dtype=torch.int32)
    prefix_ids = torch.tensor([[-1, -1, 5, 5, 5, 5, -1, -1, -1, -1]], dtype=torch.int32)
    segments = Segments(sample_ids, prefix_ids)
    positions = torch.arange(10)
    mask = segments.visible(0, positions.unsqueeze(-1), positions)
    visible = [torch.nonzero(row).flatten().tolist() for row in mask]
    assert visible == [[0], [0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 4], [0, 1, 4, 5], [6], [6, 7], [8], [8, 9]]
    assert visible_pairs(sample_ids, prefix_ids) == 1 + 2 + 3 + 4 + 3 + 4 + 1 + 2  # padding's queries not counted
    # sample 1's first token is predicted by the prompt's last token, not by sample 0's
    assert segments.predictors().tolist() == [[-1, 0, 1, 2, 1, 4, -1, 6, -1, 8]]
    assert segments.first_visible().tolist() == [[0, 0, 0, 0, 0, 0, 6, 6, 8, 8]]
    keys, tile = segments.tile(0, 4, 6)  # sample 1's queries see the prompt and itself, not sample 0
    assert keys.tolist() == [0, 1, 4, 5] and tile.tolist() == [[True, True, True, False], [True] * 4]


def test_token_logprobs_use_the_predictor_and_each_tokens_temperature():
    head = torch.nn.Identity()  # the "hidden states" are the logits
    hidden = torch.tensor([[[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[0, 1, 0]])
    temps = torch.tensor([[1.0, 2.0, 0.5]])
    wanted = torch.ones(1, 3, dtype=torch.bool)
    lp, ent = token_logprobs(hidden, head, ids, temps, torch.tensor([[-1, 0, 1]]), wanted)
    # token 1 at position 1 is predicted by logits[0] / 2 = [0, 1]
    assert lp[0, 1].item() == pytest.approx(math.log(math.e / (1 + math.e)))
    # token 0 at position 2 is predicted by logits[1] / 0.5 = [2, 0]
    assert lp[0, 2].item() == pytest.approx(math.log(math.exp(2) / (math.exp(2) + 1)))
    assert lp[0, 0].item() == 0 and ent[0, 0].item() == 0
    p = 1 / (1 + math.e)
    assert ent[0, 1].item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)))
    # a shared prompt: position 0 predicts tokens 1 and 2, each at its own temperature
    lp, _ = token_logprobs(hidden, head, ids, torch.tensor([[1.0, 2.0, 0.5]]), torch.tensor([[-1, 0, 0]]), wanted)
    assert lp[0, 1].item() == pytest.approx(math.log(math.e / (1 + math.e)))
    assert lp[0, 2].item() == pytest.approx(math.log(1 / (1 + math.exp(4))))
    # only wanted tokens are computed, in chunks that give the same values
    chunked, _ = token_logprobs(hidden, head, ids, temps, torch.tensor([[-1, 0, 1]]), wanted, chunk=1)
    torch.testing.assert_close(chunked, token_logprobs(hidden, head, ids, temps, torch.tensor([[-1, 0, 1]]), wanted)[0])
    lp, _ = token_logprobs(hidden, head, ids, temps, torch.tensor([[-1, 0, 1]]), torch.tensor([[True, True, False]]))
    assert lp[0, 2].item() == 0


def test_a_model_with_another_attention_is_refused(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation="eager")
    batch = pack_batch(grouped_samples(groups=1, group_size=2), 64, world_size=1, micro_batch_rows=1)[0][0]
    with pytest.raises(ValueError, match=f"attends with 'eager'.*{SEGMENT_ATTENTION}"):
        policy_logprobs(model, batch)


def grouped_samples(groups: int, group_size: int, seed: int = 0) -> list[Sample]:
    """GRPO-shaped samples; each has its own advantage, which identifies it after packing."""
    rng = random.Random(seed)
    samples = []
    for _ in range(groups):
        prompt = [rng.randrange(256) for _ in range(rng.randint(8, 20))]
        for _ in range(group_size):
            completion = [rng.randrange(256) for _ in range(rng.randint(2, 16))]
            samples.append(Sample(
                token_ids=prompt + completion,
                loss_mask=[False] * len(prompt) + [True] * len(completion),
                logprobs=[0.0] * len(prompt) + [-1.0] * len(completion),
                temperature=0.7,
                advantage=(len(samples) + 1) / 100,
            ))
    return samples


def test_visible_pairs_are_what_the_mask_of_packed_rows_lets_through():
    for share in (False, True):
        for batch in pack_batch(grouped_samples(groups=5, group_size=4), 64, world_size=1, micro_batch_rows=3,
                                share_prompts=share)[0]:
            mask = Segments(batch["sample_ids"], batch["prefix_ids"]).rows_mask()[:, 0]
            assert visible_pairs(batch["sample_ids"], batch["prefix_ids"]) == int(mask[batch["sample_ids"] >= 0].sum())


def logprobs_and_grads(model, micro_batches) -> tuple[dict[float, torch.Tensor], dict[str, torch.Tensor], int]:
    """Per sample (keyed by advantage) its loss tokens' log-probs; the gradients of
    sum(A * logp); the tokens computed."""
    model.zero_grad(set_to_none=True)
    per_sample, tokens = {}, 0
    for batch in micro_batches:
        logprobs, _ = policy_logprobs(model, batch)
        (logprobs * batch["advantages"])[batch["loss_mask"]].sum().backward()
        mask = batch["loss_mask"]
        for advantage in batch["advantages"][mask].unique().tolist():
            per_sample[round(advantage, 4)] = logprobs.detach()[mask & (batch["advantages"] == advantage)]
        tokens += int((batch["sample_ids"] >= 0).sum())
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return per_sample, grads, tokens


def model_and_rows(tiny_model) -> tuple[torch.nn.Module, list[Sample], list[dict], list[dict]]:
    """The tiny model on the segment attention; 5 groups of 4 samples; their micro-batches of
    64-token rows with each prompt repeated, and with prompts shared (most groups do not fit
    one row, so they split and repeat the prompt)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32, attn_implementation=register())
    samples = grouped_samples(groups=5, group_size=4)
    plain, shared = (pack_batch(samples, 64, world_size=1, micro_batch_rows=3, share_prompts=share)[0]
                     for share in (False, True))
    return model, samples, plain, shared


@pytest.mark.parametrize("query_chunk", [512, 16], ids=["one-tile-per-row", "tiles-of-16-queries"])
def test_shared_prompts_give_the_unshared_logprobs_and_gradients(tiny_model, query_chunk, monkeypatch):
    from rlkube.trainer.rl import attention

    monkeypatch.setattr(attention, "QUERY_CHUNK", query_chunk)
    model, samples, plain, shared = model_and_rows(tiny_model)
    lp_plain, grads_plain, tokens_plain = logprobs_and_grads(model, plain)
    lp_shared, grads_shared, tokens_shared = logprobs_and_grads(model, shared)

    assert tokens_shared < 0.8 * tokens_plain
    assert sorted(lp_shared) == sorted(lp_plain) == [round((i + 1) / 100, 4) for i in range(len(samples))]
    for advantage, expected in lp_plain.items():
        torch.testing.assert_close(lp_shared[advantage], expected, rtol=0, atol=1e-5)
    assert grads_shared.keys() == grads_plain.keys()
    for name, expected in grads_plain.items():
        # Sharing changes the order of float32 sums: an entry that is a near-cancelling sum
        # (an embedding row) moves by ~1e-6 while the gradients reach ~1; a wrong mask moves
        # whole rows by far more than this.
        atol = 1e-5 * float(expected.abs().max())
        torch.testing.assert_close(grads_shared[name], expected, rtol=1e-4, atol=atol, msg=name)

    # and both are the log-probs of each sample run alone, unpacked
    sample = samples[7]
    n = sum(sample.loss_mask)
    with torch.no_grad():
        alone_segments = Segments(torch.zeros(1, len(sample.token_ids)), torch.full((1, len(sample.token_ids)), -1))
        logits = model(input_ids=torch.tensor([sample.token_ids]), segments=alone_segments).logits[0, -n - 1 : -1]
    alone = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(sample.token_ids[-n:])[:, None])[:, 0]
    torch.testing.assert_close(lp_shared[0.08], alone, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_the_cuda_path_flex_attention_matches_the_cpu_tiles(monkeypatch):
    """FlexAttention (what CUDA runs) with the segments' BlockMask, in forward on CPU (its
    backward is CUDA-only), against the tiled SDPA the CPU runs."""
    from rlkube.trainer.rl import attention

    monkeypatch.setattr(attention, "QUERY_CHUNK", 128)
    batch = pack_batch(grouped_samples(groups=12, group_size=4), 300, world_size=1, micro_batch_rows=2)[0][0]
    segments = Segments(batch["sample_ids"], batch["prefix_ids"])
    rows, seq_len = batch["input_ids"].shape
    query, key, value = torch.randn(rows, 4, seq_len, 64), torch.randn(rows, 2, seq_len, 64), torch.randn(rows, 2, seq_len, 64)
    with torch.no_grad():
        tiles = attention._chunked_sdpa(query, key, value, segments, None)
        flex = attention._compiled_flex_attention()(query, key, value, block_mask=segments.block_mask(), enable_gqa=True)
    torch.testing.assert_close(flex, tiles, rtol=0, atol=1e-5)
