"""One rank of `test_packed_fsdp.py`: the packed log-probs and their gradients through FSDP2
(parameters sharded over the ranks) against the same model unsharded in this process."""

import json
import sys

import torch
from rlkube.config import ModelConfig, ParallelConfig
from rlkube.orchestrator.packing import pack_batch
from rlkube.trainer.dist import close_distributed, init_distributed
from rlkube.trainer.model import build_model
from rlkube.trainer.rl.attention import register
from rlkube.trainer.rl.packed import policy_logprobs
from transformers import AutoModelForCausalLM

from tests.trainer.rl.test_packed import grouped_samples


def objective(model, batch) -> torch.Tensor:
    logprobs, _ = policy_logprobs(model, batch)
    (logprobs * batch["advantages"])[batch["loss_mask"]].sum().backward()
    return logprobs.detach()


def main(model_dir: str, out: str) -> None:
    info = init_distributed("cpu", cpu_threads=1)
    batch = pack_batch(grouped_samples(groups=3, group_size=3), 64, world_size=1, micro_batch_rows=2)[0][0]
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=register())
    reference.train()
    sharded = build_model(ModelConfig(name=model_dir), ParallelConfig(), info.device, torch.float32, packed_attention=True)
    with torch.no_grad():  # a no-grad forward first (as when scoring), then a training one
        policy_logprobs(sharded, batch)
    expected, got = objective(reference, batch), objective(sharded, batch)
    grads = {name: p.grad.full_tensor() for name, p in sharded.named_parameters()}
    report = {
        "logprob_diff": float((expected - got).abs().max()),
        "grad_diff": max(float((grads[n] - p.grad).abs().max()) for n, p in reference.named_parameters()),
        "grad_max": max(float(p.grad.abs().max()) for p in reference.parameters()),
    }
    if info.rank == 0:
        with open(out, "w") as f:
            json.dump(report, f)
    close_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:])
