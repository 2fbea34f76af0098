"""The RL losses against values computed by hand."""

import dataclasses
import math

import pytest
import torch
from rlkube.config import LossConfig
from rlkube.trainer.rl.loss import LossInputs, compute_loss, sequence_mean


def make_inputs(p_policy, p_inference, advantages, loss_mask=None, sample_ids=None):
    """One row of tokens given as probabilities, so thresholds are easy to reason about."""
    logprobs = torch.tensor([p_policy], dtype=torch.float64).log().requires_grad_(True)
    n = len(p_policy)
    return LossInputs(
        logprobs=logprobs,
        inference_logprobs=torch.tensor([p_inference], dtype=torch.float64).log(),
        advantages=torch.tensor([advantages], dtype=torch.float64),
        loss_mask=torch.tensor([loss_mask or [True] * n]),
        sample_ids=torch.tensor([sample_ids or [0] * n]),
    )


def test_default_masks_on_probability_difference_in_the_advantage_direction():
    # token 0: A>0, p rose 0.30 -> masked high; token 1: A>0, p rose 0.10 -> kept;
    # token 2: A<0, p fell 0.30 -> masked low; token 3: A<0, p ROSE 0.30 -> kept (wrong direction);
    # token 4: A>0, tiny probabilities: log-ratio is huge (log 50) but the probability moved
    # by 0.049 -> kept, which is what distinguishes probability from log-prob thresholds.
    p_pol = [0.8, 0.6, 0.2, 0.8, 0.05]
    p_inf = [0.5, 0.5, 0.5, 0.5, 0.001]
    adv = [1.0, 1.0, -1.0, -1.0, 2.0]
    inputs = make_inputs(p_pol, p_inf, adv)
    cfg = LossConfig(mask_high=0.2, mask_low=0.2, kl_tau=0.0)
    loss, stats = compute_loss(inputs, cfg, global_loss_tokens=5)

    keep = [0, 1, 0, 1, 1]
    expected = sum(-k * a * (pp / pi) for k, a, pp, pi in zip(keep, adv, p_pol, p_inf)) / 5
    assert loss.item() == pytest.approx(expected)
    assert stats["masked_high/fraction"].item() == pytest.approx(1 / 5)
    assert stats["masked_low/fraction"].item() == pytest.approx(1 / 5)

    loss.backward()
    # d/dlogp of -A * r is -A * r on kept tokens; masked tokens get no gradient
    grad = inputs.logprobs.grad[0].tolist()
    assert grad[0] == 0 and grad[2] == 0
    assert grad[1] == pytest.approx(-1.0 * 0.6 / 0.5 / 5)
    assert grad[4] == pytest.approx(-2.0 * 0.05 / 0.001 / 5)


def test_default_kl_term_and_mismatch_kl():
    p_pol, p_inf = [0.4, 0.9], [0.5, 0.3]
    inputs = make_inputs(p_pol, p_inf, [0.0, 0.0])
    loss, stats = compute_loss(inputs, LossConfig(kl_tau=0.5), global_loss_tokens=2)
    log_r = [math.log(a / b) for a, b in zip(p_pol, p_inf)]
    assert loss.item() == pytest.approx(0.5 * sum(x * x for x in log_r) / 2)
    k3 = [math.exp(x) - 1 - x for x in log_r]
    assert stats["mismatch_kl/mean"].item() == pytest.approx(sum(k3) / 2)
    assert stats["mismatch_kl/max"].item() == pytest.approx(max(k3))


def test_loss_mask_excludes_tokens_and_global_count_normalizes():
    inputs = make_inputs([0.5, 0.5, 0.5], [0.5, 0.5, 0.5], [1.0, 3.0, 5.0], loss_mask=[True, False, True])
    loss, _ = compute_loss(inputs, LossConfig(kl_tau=0.0), global_loss_tokens=10)
    assert loss.item() == pytest.approx(-(1.0 + 5.0) / 10)


def test_rank_shards_sum_to_the_whole_batch_loss_and_gradient():
    """Normalization by the global token count: two 'ranks' with unequal token counts, each
    dividing by the global count, sum to the loss of the whole batch (what FSDP's gradient
    all-reduce then combines); a per-rank mean would not."""
    torch.manual_seed(0)
    logits = torch.randn(1, 7, dtype=torch.float64)
    inf = (logits + 0.1 * torch.randn_like(logits)).detach()
    adv = torch.randn(1, 7, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True, True, True, True]])
    cfg = LossConfig(kl_tau=0.01)

    def shard(sl, total):
        lp = logits[:, sl].clone().requires_grad_(True)
        inputs = LossInputs(lp, inf[:, sl], adv[:, sl], mask[:, sl], torch.zeros_like(mask[:, sl], dtype=torch.long))
        loss, _ = compute_loss(inputs, cfg, global_loss_tokens=total)
        loss.backward()
        return loss.item(), lp.grad

    total = int(mask.sum())
    whole, whole_grad = shard(slice(0, 7), total)
    a, grad_a = shard(slice(0, 2), total)  # 2 loss tokens
    b, grad_b = shard(slice(2, 7), total)  # 4 loss tokens
    assert a + b == pytest.approx(whole)
    assert torch.allclose(torch.cat([grad_a, grad_b], dim=1), whole_grad)
    local_means = (a * total / 2 + b * total / 4) / 2
    assert local_means != pytest.approx(whole)


def test_grpo_clips_ratio_pessimistically():
    # r = 1.5 with A>0 -> clipped at 1.2 (no gradient); r = 0.5 with A<0 -> clipped at 0.8;
    # r = 1.1 with A>0 -> unclipped.
    inputs = make_inputs([0.75, 0.25, 0.55], [0.5, 0.5, 0.5], [1.0, -1.0, 2.0])
    loss, stats = compute_loss(inputs, LossConfig(type="grpo", kl_tau=0.0), global_loss_tokens=3)
    expected = (-1.2 * 1.0 + 0.8 * 1.0 - 1.1 * 2.0) / 3
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    grad = inputs.logprobs.grad[0].tolist()
    assert grad[0] == 0 and grad[1] == 0 and grad[2] == pytest.approx(-2.0 * 1.1 / 3)
    assert stats["masked_high/fraction"].item() == pytest.approx(1 / 3)
    assert stats["masked_low/fraction"].item() == pytest.approx(1 / 3)


def test_gspo_uses_one_geometric_mean_ratio_per_sample():
    # sample 0: token ratios 1.2 and 1/1.2 -> sequence ratio 1 (no clipping though tokens move);
    # sample 1: ratios 1.5 and 1.5 -> 1.5, clipped at 1.2 with A > 0.
    inputs = make_inputs([0.6, 0.5 / 1.2, 0.3, 0.3], [0.5, 0.5, 0.2, 0.2], [1.0, 1.0, 2.0, 2.0], sample_ids=[4, 4, 9, 9])
    loss, stats = compute_loss(inputs, LossConfig(type="gspo", kl_tau=0.0), global_loss_tokens=4)
    assert loss.item() == pytest.approx((-1.0 - 1.0 - 1.2 * 2 - 1.2 * 2) / 4)
    loss.backward()
    grad = inputs.logprobs.grad[0].tolist()
    assert grad[0] == pytest.approx(-1.0 / 4) and grad[1] == pytest.approx(-1.0 / 4)
    assert grad[2] == 0 and grad[3] == 0
    assert stats["masked_high/fraction"].item() == pytest.approx(2 / 4)


def test_sequence_mean_ignores_masked_tokens():
    values = torch.tensor([[1.0, 3.0, 100.0, 5.0]])
    out = sequence_mean(values, torch.tensor([[0, 0, 0, 1]]), torch.tensor([[True, True, False, True]]))
    assert out.tolist() == [[2.0, 2.0, 2.0, 5.0]]


def test_cispo_clips_the_weight_but_keeps_the_gradient():
    inputs = make_inputs([0.75, 0.5], [0.5, 0.5], [1.0, -1.0])
    loss, stats = compute_loss(inputs, LossConfig(type="cispo", kl_tau=0.0), global_loss_tokens=2)
    lp = [math.log(0.75), math.log(0.5)]
    assert loss.item() == pytest.approx((-1.2 * 1.0 * lp[0] + 1.0 * 1.0 * lp[1]) / 2)
    loss.backward()
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([-1.2 / 2, 1.0 / 2])
    assert stats["masked_high/fraction"].item() == pytest.approx(1 / 2)


def half_advantage_loss(inputs, config):
    """A custom loss for the test: plain REINFORCE at half strength."""
    return -0.5 * inputs.advantages * inputs.logprobs


def test_custom_loss_by_import_path():
    inputs = make_inputs([0.5], [0.5], [2.0])
    cfg = LossConfig(type="custom", custom_loss=f"{__name__}:half_advantage_loss")
    loss, _ = compute_loss(inputs, cfg, global_loss_tokens=1)
    assert loss.item() == pytest.approx(-0.5 * 2.0 * math.log(0.5))


def test_custom_loss_bad_path_names_it():
    cfg = LossConfig(type="custom", custom_loss="no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="loss.custom_loss: cannot import .no_such_module_xyz:fn"):
        compute_loss(make_inputs([0.5], [0.5], [1.0]), cfg, global_loss_tokens=1)



def with_teacher(inputs: LossInputs, p_teacher) -> LossInputs:
    return dataclasses.replace(inputs, teacher_logprobs=torch.tensor([p_teacher], dtype=torch.float64).log())


def test_opd_is_the_importance_weighted_reverse_kl_to_the_teacher():
    # token 0: on-policy (r = 1), the teacher likes it more (0.8 > 0.5);
    # token 1: r = 0.2 / 0.25 = 0.8, the teacher likes it less (0.1 < 0.2); token 2: not a loss token.
    # The advantages are ignored by `opd`.
    inputs = with_teacher(
        make_inputs([0.5, 0.2, 0.4], [0.5, 0.25, 0.4], [5.0, -5.0, 5.0], loss_mask=[True, True, False]),
        [0.8, 0.1, 0.01],
    )
    cfg = LossConfig(type="opd", teacher_kl_coef=2.0, kl_tau=0.0)
    loss, stats = compute_loss(inputs, cfg, global_loss_tokens=4)
    gap = [math.log(0.5 / 0.8), math.log(0.2 / 0.1)]
    assert loss.item() == pytest.approx((2.0 * gap[0] * 1.0 + 2.0 * gap[1] * 0.8) / 4)
    assert stats["teacher_kl/mean"].item() == pytest.approx((gap[0] + gap[1]) / 4)
    loss.backward()
    # d/dlogp of coef * sg(gap) * r is coef * gap * r
    assert inputs.logprobs.grad[0].tolist() == pytest.approx([2.0 * gap[0] / 4, 2.0 * gap[1] * 0.8 / 4, 0.0])


def test_opd_keeps_the_kl_penalty_against_the_inference_policy():
    inputs = with_teacher(make_inputs([0.4], [0.5], [0.0]), [0.4])  # the teacher agrees: no KL term
    loss, _ = compute_loss(inputs, LossConfig(type="opd", teacher_kl_coef=1.0, kl_tau=0.5), global_loss_tokens=1)
    assert loss.item() == pytest.approx(0.5 * math.log(0.4 / 0.5) ** 2)


def test_opd_pushes_up_a_token_the_teacher_finds_likelier():
    """One gradient step on the logits of a 3-token vocabulary: the sampled token, which the
    teacher finds likelier than the student does, gains probability."""
    logits = torch.tensor([[0.0, 1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    logprobs = torch.log_softmax(logits, -1)[:, :1]  # token 0 was sampled
    inputs = LossInputs(
        logprobs=logprobs, inference_logprobs=logprobs.detach(), advantages=torch.zeros(1, 1, dtype=torch.float64),
        loss_mask=torch.tensor([[True]]), sample_ids=torch.zeros(1, 1, dtype=torch.long),
        teacher_logprobs=torch.tensor([[math.log(0.9)]], dtype=torch.float64),
    )
    loss, _ = compute_loss(inputs, LossConfig(type="opd", teacher_kl_coef=1.0, kl_tau=0.0), global_loss_tokens=1)
    loss.backward()
    stepped = torch.softmax(logits.detach() - 0.1 * logits.grad, -1)[0, 0]
    assert stepped > torch.softmax(logits.detach(), -1)[0, 0]


def test_rl_types_add_the_teacher_term_when_its_coefficient_is_set():
    # grpo: r = 1.1, A = 2 (unclipped) -> -2.2; teacher term 0.5 * log(0.55 / 0.25) * 1.1.
    inputs = with_teacher(make_inputs([0.55], [0.5], [2.0]), [0.25])
    loss, stats = compute_loss(inputs, LossConfig(type="grpo", teacher_kl_coef=0.5, kl_tau=0.0), global_loss_tokens=1)
    gap = math.log(0.55 / 0.25)
    assert loss.item() == pytest.approx(-2.2 + 0.5 * gap * 1.1)
    loss.backward()
    assert inputs.logprobs.grad.item() == pytest.approx(-2.2 + 0.5 * gap * 1.1)
    assert stats["teacher_kl/mean"].item() == pytest.approx(gap)


def test_rl_with_a_teacher_but_no_coefficient_only_reports_the_kl():
    inputs = with_teacher(make_inputs([0.55], [0.5], [2.0]), [0.25])
    loss, stats = compute_loss(inputs, LossConfig(type="grpo", kl_tau=0.0), global_loss_tokens=1)
    assert loss.item() == pytest.approx(-2.2)
    assert stats["teacher_kl/mean"].item() == pytest.approx(math.log(0.55 / 0.25))


def test_distillation_without_teacher_logprobs_names_the_fields():
    cfg = LossConfig(type="opd", teacher_kl_coef=1.0)
    with pytest.raises(ValueError, match="loss.type 'opd' with loss.teacher_kl_coef 1 needs the teacher's log-probs"):
        compute_loss(make_inputs([0.5], [0.5], [1.0]), cfg, global_loss_tokens=1)
    # a padding-only micro-batch (no loss tokens) has nothing to distill
    loss, _ = compute_loss(make_inputs([0.5], [0.5], [0.0], loss_mask=[False]), cfg, global_loss_tokens=0)
    assert loss.item() == 0
