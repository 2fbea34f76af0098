"""Run by test_two_ranks.py under torchrun: one RL step on this rank's half of a batch.

    torchrun --nproc-per-node 2 tests/trainer/rl/rank_worker.py MODEL_DIR PORT OUT_JSON
"""

import json
import sys

import torch
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer
from rlkube.transport.client import RolloutClient

from tests.trainer.rl.test_trainer import (
    RecordingMetrics,
    RecordingPublisher,
    Server,
    SyntheticSource,
    two_rank_batches,
)


class PerRankSource(SyntheticSource):
    def __init__(self, batches):
        super().__init__(None)
        self.batches = batches

    async def get_batch(self, step, rank, world_size, micro_batch_rows):
        return [self.batches[rank]]


def main(model_dir: str, port: int, out: str) -> None:
    config = TrainerConfig(model={"name": model_dir}, max_steps=1, device="cpu", rollouts={"port": port})
    env = build_training_env(config)
    client = RolloutClient(f"127.0.0.1:{port}", timeout_s=60)
    trainer = RLTrainer(config, env, client, RecordingPublisher(), None, RecordingMetrics())
    if env.rank == 0:
        with Server(PerRankSource(two_rank_batches()), port):
            trainer.train()
        with open(out, "w") as f:
            json.dump(trainer.metrics.records[1], f)
    else:
        trainer.train()
    env.close()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
