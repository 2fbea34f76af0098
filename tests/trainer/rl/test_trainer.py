"""The RL trainer loop on the tiny model, fed over real gRPC by a synthetic batch source."""

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from rlkube.checkpoints import is_complete
from rlkube.config import TrainerConfig
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.packed import policy_logprobs
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer
from rlkube.transport.client import RolloutClient
from rlkube.transport.server import start_server, stop_server
from rlkube.transport.weights import WeightPublisher

from tests.fixtures.inference import free_port

SEQ_LEN = 24


def synthetic_batch(generator: torch.Generator) -> dict:
    """One row, two packed samples of 12 tokens; the last 6 of each are the completion.
    Sample 0 is rewarded (A = +1), sample 1 punished (A = -1)."""
    ids = torch.randint(0, 200, (1, SEQ_LEN), generator=generator)
    positions = torch.arange(12).repeat(2).unsqueeze(0)
    sample_ids = torch.tensor([[0] * 12 + [1] * 12], dtype=torch.int32)
    loss_mask = (positions >= 6)
    advantages = torch.where(sample_ids == 0, 1.0, -1.0) * loss_mask
    return {
        "input_ids": ids, "position_ids": positions, "sample_ids": sample_ids,
        "prefix_ids": torch.full_like(sample_ids, -1), "loss_mask": loss_mask,
        "advantages": advantages.float(), "temperatures": torch.ones(1, SEQ_LEN),
        "global_loss_tokens": int(loss_mask.sum()),
    }


class SyntheticSource:
    """The same batch every step, with inference log-probs from the initial policy."""

    instance_id = "synthetic-orchestrator"

    def __init__(self, batch):
        self.batch, self.reports = batch, []

    async def get_batch(self, step, rank, world_size, micro_batch_rows):
        return [self.batch]

    async def report_policy(self, step, location):
        self.reports.append((step, location))
        return step

    def status(self):
        return {"phase": "running", "step": 0, "max_steps": 0, "reward": None, "policy_step": 0}


class Server:
    def __init__(self, source, port):
        self.loop = asyncio.new_event_loop()
        self.ready, self.source, self.port = threading.Event(), source, port
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)

    async def _main(self):
        self.stopping = asyncio.Event()
        server = await start_server(self.source, "127.0.0.1", self.port)
        self.ready.set()
        await self.stopping.wait()
        await stop_server(server, grace_s=1)

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(20)
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)


class RecordingPublisher(WeightPublisher):
    def __init__(self):
        self.published = {}

    def publish(self, state_dict, step):
        self.published[step] = {k: v.clone() for k, v in state_dict.items()}
        return f"memory://{step}"


class RecordingMetrics:
    def __init__(self):
        self.records = {}

    def log(self, step, metrics):
        self.records[step] = metrics


def sample_logprob(model, batch, sample):
    with torch.no_grad():
        lp, _ = policy_logprobs(model, batch)
    keep = batch["loss_mask"] & (batch["sample_ids"] == sample)
    return lp[keep].mean().item()


@pytest.fixture
def trainer_config(tiny_model, tmp_path, world_of_one):
    return TrainerConfig(
        output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=4, device="cpu",
        optim={"lr": 3e-4}, ckpt={"interval": 2}, loss={"kl_tau": 0.0},
        rollouts={"port": free_port(), "timeout_s": 60},
    )


def make_trainer(config, source_batch):
    env = build_training_env(config)
    client = RolloutClient(f"127.0.0.1:{config.rollouts.port}", timeout_s=60)
    checkpointer = TrainerCheckpointer(config.output_dir / "checkpoints", config.ckpt, env.rank)
    return RLTrainer(config, env, client, RecordingPublisher(), checkpointer, RecordingMetrics())


def test_rl_steps_move_logprobs_with_the_advantage_and_publish_each_policy(trainer_config):
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    trainer = make_trainer(trainer_config, batch)
    with torch.no_grad():
        batch["inference_logprobs"] = policy_logprobs(trainer.model, batch)[0].float()
    before = [sample_logprob(trainer.model, batch, s) for s in (0, 1)]
    source = SyntheticSource(batch)
    with Server(source, trainer_config.rollouts.port):
        trainer.train()
    after = [sample_logprob(trainer.model, batch, s) for s in (0, 1)]
    assert after[0] > before[0] + 0.05, "rewarded tokens should become likelier"
    assert after[1] < before[1] - 0.05, "punished tokens should become less likely"

    assert [s for s, _ in source.reports] == [1, 2, 3, 4]
    first = trainer.metrics.records[1]
    assert first["mismatch_kl/mean"] == pytest.approx(0.0, abs=1e-6), "step 1 trains the sampling policy"
    assert trainer.metrics.records[4]["mismatch_kl/mean"] > 0
    for key in ("loss/mean", "entropy/mean", "mismatch_kl/max", "masked_high/fraction", "optim/grad_norm",
                "optim/lr", "perf/tokens_per_s", "perf/compiles", "time/step", "time/wait_for_batch",
                "time/forward_backward", "time/optimizer", "time/publish_weights"):
        assert key in first, key
    published = trainer.publisher.published[4]
    assert "lm_head.weight" not in published, "a tied head is the embedding: sent once"
    embedding = "model.embed_tokens.weight"
    assert torch.equal(published[embedding], trainer.env.full_state_dict()[embedding])

    # resume from step 2: same weights as published at step 2, and the step counter restored
    resumed = make_trainer(trainer_config.model_copy(update={"ckpt": trainer_config.ckpt.model_copy(update={"resume_step": 2})}), batch)
    resumed.resume()
    assert resumed.step == 2
    root = trainer_config.output_dir / "checkpoints"
    assert is_complete(root, 2, "trainer") and not is_complete(root, 4, "trainer"), "step 4 is abandoned"
    assert 2 in resumed.publisher.published, "the resumed policy is published again"
    weights = resumed.env.full_state_dict()
    assert trainer.publisher.published[2].keys() == weights.keys() - {"lm_head.weight"}
    for name, tensor in trainer.publisher.published[2].items():
        assert torch.equal(tensor, weights[name]), name


def test_a_batch_with_nothing_to_train_on_is_never_a_step(trainer_config):
    """Behind the orchestrator's floor (`orchestrator.min_batch_samples`): a batch without a loss
    token stops the trainer before its optimizer step, publish and checkpoint."""
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    batch["loss_mask"][:] = False
    batch["advantages"][:] = 0.0
    batch["global_loss_tokens"] = 0
    batch["inference_logprobs"] = torch.zeros(1, SEQ_LEN)
    trainer = make_trainer(trainer_config, batch)
    weights = {k: v.clone() for k, v in trainer.env.full_state_dict().items()}
    source = SyntheticSource(batch)
    with Server(source, trainer_config.rollouts.port), pytest.raises(RuntimeError, match="batch 1 has no tokens"):
        trainer.train()
    assert source.reports == [] and trainer.publisher.published == {} and trainer.step == 0
    assert all(torch.equal(v, weights[k]) for k, v in trainer.env.full_state_dict().items())


def two_rank_batches() -> list[dict]:
    """Two ranks' shares of one step with unequal loss-token counts (12 and 4)."""
    a = synthetic_batch(torch.Generator().manual_seed(1))
    b = synthetic_batch(torch.Generator().manual_seed(2))
    b["loss_mask"][:, :20] = False
    total = int(a["loss_mask"].sum() + b["loss_mask"].sum())
    for batch in (a, b):
        batch["advantages"] = batch["advantages"] * batch["loss_mask"]
        batch["inference_logprobs"] = torch.full((1, SEQ_LEN), -5.0)
        batch["global_loss_tokens"] = total
    return [a, b]


@pytest.mark.slow
def test_two_gloo_ranks_match_one_rank_on_the_whole_batch(tiny_model, tmp_path, world_of_one):
    """FSDP2 over two gloo ranks, each normalizing by the global token count, gives the same
    loss and gradient norm as one rank training on both shares, and counts the same samples."""
    repo = Path(__file__).resolve().parents[3]
    out = tmp_path / "two_ranks.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(repo / "tests/trainer/rl/rank_worker.py"), str(tiny_model), str(free_port()), str(out)]
    subprocess.run(cmd, check=True, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, timeout=300)
    two = json.loads(out.read_text())

    port = free_port()
    config = TrainerConfig(model={"name": str(tiny_model)}, max_steps=1, device="cpu", rollouts={"port": port})
    trainer = RLTrainer(config, build_training_env(config), RolloutClient(f"127.0.0.1:{port}", timeout_s=60),
                        RecordingPublisher(), None, RecordingMetrics())

    class BothShares(SyntheticSource):
        async def get_batch(self, step, rank, world_size, micro_batch_rows):
            return two_rank_batches()

    with Server(BothShares(None), port):
        trainer.train()
    one = trainer.metrics.records[1]
    for key in ("loss/mean", "optim/grad_norm", "mismatch_kl/mean", "mismatch_kl/max", "entropy/mean"):
        assert two[key] == pytest.approx(one[key], rel=1e-4), key
    # `samples/trained`, summed over ranks: both of a's samples, and the one of b's left with loss tokens
    assert two["samples/trained"] == one["samples/trained"] == 3
