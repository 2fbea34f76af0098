"""The RL trainer distilling: teacher log-probs over real gRPC move the student toward the
teacher, whatever the advantages say."""

import pytest
import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.packed import policy_logprobs

from tests.fixtures.inference import free_port
from tests.trainer.rl.test_trainer import (
    Server,
    SyntheticSource,
    make_trainer,
    sample_logprob,
    synthetic_batch,
)


@pytest.fixture
def opd_config(tiny_model, tmp_path, world_of_one):
    return TrainerConfig(
        output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=4, device="cpu", optim={"lr": 3e-4},
        loss={"type": "opd", "teacher_kl_coef": 1.0, "kl_tau": 0.0}, rollouts={"port": free_port(), "timeout_s": 60},
    )


def test_opd_steps_move_logprobs_toward_the_teacher_not_the_advantage(opd_config):
    """The teacher is sure of sample 1's tokens (log-prob 0) and rules out sample 0's (-20);
    the advantages say the opposite (sample 0 rewarded): `opd` follows the teacher."""
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    batch["teacher_logprobs"] = torch.where(batch["sample_ids"] == 0, -20.0, 0.0) * batch["loss_mask"]
    trainer = make_trainer(opd_config, batch)
    with torch.no_grad():
        batch["inference_logprobs"] = policy_logprobs(trainer.model, batch)[0].float()
    before = [sample_logprob(trainer.model, batch, s) for s in (0, 1)]
    with Server(SyntheticSource(batch), opd_config.rollouts.port):
        trainer.train()
    after = [sample_logprob(trainer.model, batch, s) for s in (0, 1)]
    assert after[0] < before[0] - 0.05, "the teacher rules these tokens out"
    assert after[1] > before[1] + 0.05, "the teacher is sure of these"
    mask = batch["loss_mask"]
    gap = (batch["inference_logprobs"] - batch["teacher_logprobs"])[mask].mean().item()
    assert trainer.metrics.records[1]["teacher_kl/mean"] == pytest.approx(gap, abs=1e-4), "step 1 is the sampler"
