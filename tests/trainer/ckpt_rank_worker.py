"""Run by test_ckpt_object_store.py under torchrun: every rank saves its FSDP shards of the tiny
model (after one optimizer step) as RL checkpoint step 1 under CKPT_URL; rank 0 writes the full
weights to OUT_PT for the test to compare with what a one-rank load restores.

    torchrun --nproc-per-node 2 tests/trainer/ckpt_rank_worker.py MODEL_DIR CKPT_URL OUT_PT
"""

import sys

import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.setup import build_training_env


def main(model_dir: str, url: str, out: str) -> None:
    config = TrainerConfig(model={"name": model_dir}, max_steps=1, device="cpu", ckpt={"url": url})
    env = build_training_env(config)
    for param in env.model.parameters():
        param.grad = torch.ones_like(param)
    env.optimizer.step()  # non-trivial optimizer state, sharded like the weights
    TrainerCheckpointer(url, config.ckpt, env.rank).save(1, env.model, env.optimizer, env.scheduler)
    weights = env.full_state_dict()
    if env.rank == 0:
        torch.save(weights, out)
    env.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:4])
