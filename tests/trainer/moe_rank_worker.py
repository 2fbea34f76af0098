"""Run by test_moe.py under torchrun: the tiny MoE model on two gloo ranks. Each rank reports
how its experts are sharded; rank 0 writes the full weights and optimizer state after two
training steps taken straight through, and after the second step taken again from a DCP
checkpoint of the first (resumed by a freshly built trainer).

    torchrun --nproc-per-node 2 tests/trainer/moe_rank_worker.py MODEL_DIR CKPT_DIR OUT_PT
"""

import sys

import torch
import torch.distributed as dist
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.packed import policy_logprobs
from rlkube.trainer.rl.setup import build_training_env
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.fsdp import FSDPModule

from tests.trainer.rl.test_trainer import synthetic_batch


def train_step(env, seed: int) -> None:
    batch = synthetic_batch(torch.Generator().manual_seed(seed))
    logprobs, _ = policy_logprobs(env.model, batch)
    (-(logprobs * batch["advantages"])[batch["loss_mask"]].mean()).backward()
    env.optimizer.step()
    env.optimizer.zero_grad(set_to_none=True)
    env.scheduler.step()


def full_state(env) -> dict:
    model, optim = get_state_dict(env.model, env.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {"model": {k: v.clone() for k, v in model.items()}, "optim": optim}


def sharding(env) -> dict:
    experts = env.model.model.layers[0].mlp.experts.gate_up_proj
    return {
        "local_experts": experts.to_local().shape[0],
        "layers_are_fsdp_units": all(isinstance(layer, FSDPModule) for layer in env.model.model.layers),
    }


def main(model_dir: str, ckpt: str, out: str) -> None:
    config = TrainerConfig(model={"name": model_dir}, max_steps=2, device="cpu", optim={"lr": 1e-3}, ckpt={"url": ckpt})
    env = build_training_env(config)
    report = {"initial": full_state(env)["model"], "sharding": [None] * env.world_size}
    dist.all_gather_object(report["sharding"], sharding(env))
    checkpointer = TrainerCheckpointer(ckpt, config.ckpt, env.rank)
    train_step(env, 1)
    checkpointer.save(1, env.model, env.optimizer, env.scheduler)
    train_step(env, 2)
    report["continued"] = full_state(env)

    resumed = build_training_env(config)
    assert checkpointer.load(1, resumed.model, resumed.optimizer, resumed.scheduler) == 1
    train_step(resumed, 2)
    report["resumed"] = full_state(resumed)
    if env.rank == 0:
        torch.save(report, out)
    env.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(*sys.argv[1:4])
