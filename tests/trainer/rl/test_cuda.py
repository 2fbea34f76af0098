"""The trainer on an NVIDIA GPU, where it runs paths the CPU never takes: FlexAttention
(compiled, forward and backward) for packed rows with shared prompts, and FSDP2 mixed precision
(bfloat16 compute over float32 master weights)."""

import pytest
import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.packed import policy_logprobs

from tests.fixtures.inference import free_port
from tests.trainer.rl.test_packed import logprobs_and_grads, model_and_rows
from tests.trainer.rl.test_trainer import (
    Server,
    SyntheticSource,
    make_trainer,
    sample_logprob,
    synthetic_batch,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (FlexAttention's backward, FSDP2 in bf16)"),
]


def on_cuda(batch: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def test_flex_attention_gives_shared_prompts_the_unshared_logprobs_and_gradients(tiny_model):
    """What `test_packed` checks on CPU's tiles, on CUDA's FlexAttention: rows whose groups share
    their prompt give every sample the log-probs and gradients of rows that repeat it, and both
    match the CPU's."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model, _, plain, shared = model_and_rows(tiny_model)
    lp_cpu, grads_cpu, _ = logprobs_and_grads(model, plain)
    model.cuda()
    lp_plain, grads_plain, _ = logprobs_and_grads(model, [on_cuda(b) for b in plain])
    lp_shared, grads_shared, _ = logprobs_and_grads(model, [on_cuda(b) for b in shared])
    assert sorted(lp_shared) == sorted(lp_plain) == sorted(lp_cpu)
    for advantage, expected in lp_plain.items():
        torch.testing.assert_close(lp_shared[advantage], expected, rtol=0, atol=1e-4)
        torch.testing.assert_close(lp_shared[advantage].cpu(), lp_cpu[advantage], rtol=0, atol=1e-4)
    for name, expected in grads_plain.items():
        atol = 1e-4 * float(expected.abs().max())
        torch.testing.assert_close(grads_shared[name], expected, rtol=1e-3, atol=atol, msg=name)
        torch.testing.assert_close(grads_shared[name].cpu(), grads_cpu[name], rtol=1e-3, atol=atol, msg=name)


def test_rl_steps_in_bf16_over_fp32_master_weights_move_logprobs_with_the_advantage(tiny_model, tmp_path, world_of_one):
    """Four RL steps on CUDA with the default dtype (`auto`: bfloat16 compute) and activation
    checkpointing: the weights FSDP2 keeps and the optimizer steps stay float32, and the
    rewarded sample's tokens become likelier, the punished one's less likely."""
    config = TrainerConfig(
        output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=4, device="cuda",
        optim={"lr": 3e-4}, loss={"kl_tau": 0.0}, parallel={"activation_checkpointing": True},
        rollouts={"port": free_port(), "timeout_s": 60},
    )
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    trainer = make_trainer(config, batch)
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    with torch.no_grad():
        batch["inference_logprobs"] = policy_logprobs(trainer.model, on_cuda(batch))[0].float().cpu()
    before = [sample_logprob(trainer.model, on_cuda(batch), s) for s in (0, 1)]
    with Server(SyntheticSource(batch), config.rollouts.port):
        trainer.train()
    after = [sample_logprob(trainer.model, on_cuda(batch), s) for s in (0, 1)]
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    assert all(p.device.type == "cuda" for p in trainer.model.parameters())
    assert after[0] > before[0] + 0.05, "rewarded tokens should become likelier"
    assert after[1] < before[1] - 0.05, "punished tokens should become less likely"
