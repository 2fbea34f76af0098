"""One rank of `test_publish_sharded.py`: the trainer's publish of its FSDP2-sharded weights
(every rank gathers, rank 0 writes), into `<out>/weights/step_1/`."""

import sys

import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.publish import PolicyPublishing
from rlkube.trainer.rl.setup import build_training_env
from rlkube.transport.weights import StoragePublisher


class NoReports:
    def report_policy(self, step, location):
        return step


def publish_once(model_dir: str, out: str) -> None:
    """Build the trainer's environment (sharded over the ranks there are) and publish policy 1
    in bfloat16, as the trainer does."""
    env = build_training_env(TrainerConfig(output_dir=out, model={"name": model_dir}, device="cpu"))
    main = env.rank == 0
    publisher = StoragePublisher(f"{out}/weights", model_dir, keep_last=None) if main else None
    publishing = PolicyPublishing(publisher, NoReports(), torch.bfloat16, is_main=main, overlap=False,
                                  barrier=env.barrier)
    try:
        publishing.publish(1, env.policy_tensors())
    finally:
        publishing.close()
        env.close()


if __name__ == "__main__":
    publish_once(*sys.argv[1:])
