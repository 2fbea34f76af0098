"""The multi-run trainer (rlkube.trainer.rl.multi_run) against solo LoRA trainers: two runs
with their own lr, schedule, seed, loss and alpha, fed the same batches over real gRPC, trained
interleaved on one pool (one joining after the other's first step, one leaving before the
other's last), give bit-identical adapters, optimizer states and published adapter files; and a
restarted pool resumes each run from its own checkpoints bit-exactly."""

import gc
import json
import os
import subprocess
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from rlkube.config import CheckpointConfig, TrainerConfig
from rlkube.trainer.lora import adapter_config, adapter_state_dict
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.multi_run import MultiRunTrainer, _local
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer
from rlkube.transport.client import RolloutClient
from rlkube.transport.publishers import make_publisher

from tests.fixtures.inference import free_port
from tests.trainer.rl.test_trainer import RecordingMetrics, Server, SyntheticSource, synthetic_batch

STEPS = 3
RUNS = {
    "a": {"seed": 1, "optim": {"lr": 2e-2}, "scheduler": {"warmup_steps": 2}, "loss": {"kl_tau": 1e-3},
          "lora": {"rank": 8, "alpha": 16.0}},
    "b": {"seed": 2, "optim": {"lr": 5e-3, "weight_decay": 0.1, "betas": (0.8, 0.99)}, "scheduler": {"type": "cosine"},
          "loss": {"type": "grpo", "clip_low": 0.1, "clip_high": 0.3}, "lora": {"rank": 8, "alpha": 4.0}},
}


class StepBatches(SyntheticSource):
    """Each step's batch drawn from (seed, step): two micro-batches per rank, normalized by
    the loss tokens of all ranks' shares; inference log-probs near the tiny model's."""

    def __init__(self, seed: int):
        super().__init__(None)
        self.seed = seed

    def shares(self, step: int, world_size: int) -> list[dict]:
        generator = torch.Generator().manual_seed(1000 * self.seed + step)
        batches = [synthetic_batch(generator) for _ in range(2 * world_size)]
        total = sum(int(b["loss_mask"].sum()) for b in batches)
        for batch in batches:
            batch["inference_logprobs"] = -5.0 + 0.5 * torch.randn(batch["input_ids"].shape, generator=generator)
            batch["global_loss_tokens"] = total
        return batches

    async def get_batch(self, step, rank, world_size, micro_batch_rows):
        return self.shares(step, world_size)[2 * rank:2 * rank + 2]


def run_config(model_dir, out: Path, name: str, port: int, **fields) -> TrainerConfig:
    fields = {"max_steps": STEPS, **RUNS[name], **fields}
    return TrainerConfig(output_dir=out / name, model={"name": str(model_dir)}, device="cpu",
                         rollouts={"port": port, "timeout_s": 60}, weights={"keep_last": None}, **fields)


def publisher_of(config: TrainerConfig, rank: int):
    """As `rlkube.trainer.rl.trainer.run` makes it: rank 0 publishes, a PEFT adapter directory."""
    if rank != 0:
        return None
    adapter = adapter_config(config.lora, config.model.name)
    return make_publisher(config.weights, config.output_dir, config.model.name, adapter_config=adapter,
                          final_step=config.max_steps)


def client_of(config: TrainerConfig) -> RolloutClient:
    return RolloutClient(f"127.0.0.1:{config.rollouts.port}", timeout_s=60)


def solo_trainer(config: TrainerConfig) -> RLTrainer:
    env = build_training_env(config)
    trainer = RLTrainer(config, env, client_of(config), publisher_of(config, env.rank), None, RecordingMetrics())
    for step in range(1, STEPS + 1):
        trainer.train_step(step)
    trainer.publishing.wait()
    return trainer


@dataclass
class Trained:
    """What a run trained, as compared: its whole adapter (on rank 0), optimizer, logged
    metrics by step and published weights' directory."""

    adapter: dict[str, torch.Tensor]
    optimizer: torch.optim.Optimizer
    records: dict[int, dict]
    weights: Path

    @classmethod
    def solo(cls, trainer: RLTrainer) -> "Trained":
        """Collective."""
        return cls(adapter_state_dict(trainer.model), trainer.optimizer, trainer.metrics.records,
                   trainer.config.output_dir / "weights")

    @classmethod
    def pooled(cls, pool: MultiRunTrainer, name: str) -> "Trained":
        """Collective: once the run's publish in flight is done."""
        member = pool.members[name]
        member.trainer.publishing.wait()
        return cls(pool.adapter_state_dict(name), member.trainer.optimizer, member.trainer.metrics.records,
                   member.config.output_dir / "weights")


def differences(name: str, expected: Trained, got: Trained, rank: int, logged, published) -> list[str]:
    """Where `got` differs from `expected` (this rank's optimizer shards; on rank 0 the adapter,
    the losses of steps `logged` and the published files of steps `published`); empty if
    nowhere."""
    found = []
    if expected.adapter.keys() != got.adapter.keys():
        found.append(f"{name}: adapter keys")
    found += [f"{name}: adapter {k}" for k in expected.adapter if not torch.equal(expected.adapter[k], got.adapter[k])]
    want, have = expected.optimizer.state_dict(), got.optimizer.state_dict()
    if len(want["state"]) != len(have["state"]) or not want["state"]:
        found.append(f"{name}: optimizer states {len(want['state'])} vs {len(have['state'])}")
    for index, state in want["state"].items():
        for key, value in state.items():
            if not torch.equal(_local(value), _local(have["state"][index][key])):
                found.append(f"{name}: optimizer state {index}.{key}")
    strip = [{k: v for k, v in group.items() if k != "params"} for group in want["param_groups"]]
    if strip != [{k: v for k, v in g.items() if k != "params"} for g in have["param_groups"]]:
        found.append(f"{name}: optimizer param groups (lr, betas ...)")
    if rank == 0:  # the one that logs metrics and publishes
        if sorted(got.records) != list(logged):
            found.append(f"{name}: steps logged {sorted(got.records)}")
        found += [f"{name}: loss/mean at step {step}" for step in logged
                  if expected.records[step]["loss/mean"] != got.records.get(step, {}).get("loss/mean")]
        found += published_differences(name, expected.weights, got.weights, published)
    return found


def published_differences(name: str, expected: Path, got: Path, steps) -> list[str]:
    found = []
    for step in steps:
        files = sorted(p.name for p in (expected / f"step_{step}").iterdir())
        if "adapter_model.safetensors" not in files or sorted(p.name for p in (got / f"step_{step}").iterdir()) != files:
            found.append(f"{name}: step {step} published {files}")
            continue
        found += [f"{name}: step {step} published {f}" for f in files
                  if (expected / f"step_{step}" / f).read_bytes() != (got / f"step_{step}" / f).read_bytes()]
    return found


def held_tensors(member) -> list[weakref.ref]:
    """Weak references to a run's adapter and optimizer state tensors."""
    tensors = list(member.adapter.values())
    tensors += [v for state in member.trainer.optimizer.state.values() for v in state.values() if torch.is_tensor(v)]
    return [weakref.ref(t) for t in tensors]


def pool_config(model_dir, root: Path) -> TrainerConfig:
    return TrainerConfig(output_dir=root / "pool", model={"name": str(model_dir)}, device="cpu", lora={"rank": 8},
                         seed=99)


def pooled_against_solo(model_dir, root: Path, ports: dict[str, int], rank: int) -> list[dict]:
    """Collective: train solo runs a and b, then both on one pool: a alone for a step, b joins,
    [a, b], [b, a], a leaves (its state freed), b's last step alone. Rank 0 serves each run's
    batches over gRPC to the solo trainer and the pooled run alike. Returns what differed, as
    each rank saw it."""
    servers = [Server(StepBatches(RUNS[name]["seed"]), port) for name, port in ports.items()] if rank == 0 else []
    for server in servers:
        server.__enter__()
    try:
        solo = {name: solo_trainer(run_config(model_dir, root / "solo", name, port)) for name, port in ports.items()}
        pool = MultiRunTrainer.build(pool_config(model_dir, root))
        slot = set(pool.slot.params)

        def add(name):
            config = run_config(model_dir, root / "pool", name, ports[name])
            pool.add_run(name, config, client_of(config), publisher_of(config, rank), None, RecordingMetrics())

        add("a")
        pool.train_step(["a"])
        add("b")
        pool.train_step(["a", "b"])
        pool.train_step(["b", "a"])
        steps = range(1, STEPS + 1)
        found = differences("a", Trained.solo(solo["a"]), Trained.pooled(pool, "a"), rank, steps, steps)
        a, b = pool.adapter_state_dict("a"), pool.adapter_state_dict("b")  # rank 0's; empty elsewhere
        a_vs_b = [k for k in a if torch.equal(a[k], b[k])]
        refs = held_tensors(pool.members["a"])
        pool.remove_run("a")
        gc.collect()
        alive = sum(ref() is not None for ref in refs)
        pool.train_step(["b"])
        found += differences("b", Trained.solo(solo["b"]), Trained.pooled(pool, "b"), rank, steps, steps)
        result = {"differences": found, "members": sorted(pool.members), "slot_unchanged": set(pool.slot.params) == slot,
                  "freed": len(refs) - alive, "alive": alive, "same_in_a_and_b": a_vs_b}
        results = [None] * pool.info.world_size
        torch.distributed.all_gather_object(results, result)
        for trainer in solo.values():
            trainer.close()
        pool.close()
        return results
    finally:
        for server in servers:
            server.__exit__(None, None, None)


def assert_bit_exact(results: list[dict]) -> None:
    for result in results:  # one per rank
        assert result["differences"] == []
        assert result["members"] == ["b"] and result["slot_unchanged"]
        assert result["alive"] == 0 and result["freed"] > 56, "the removed run's adapter and optimizer state are freed"
        assert result["same_in_a_and_b"] == [], "the two runs trained different adapters"


@pytest.mark.slow  # training runs
def test_a_pool_of_two_runs_is_bit_exact_to_two_solo_lora_trainers(tiny_model, tmp_path, world_of_one):
    results = pooled_against_solo(tiny_model, tmp_path, {"a": free_port(), "b": free_port()}, rank=0)
    assert len(results) == 1
    assert_bit_exact(results)


@pytest.mark.slow
def test_on_two_gloo_ranks_too(tiny_model, tmp_path):
    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "result.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(repo / "tests/trainer/multi_run_worker.py"), str(tiny_model), str(tmp_path / "runs"),
           str(free_port()), str(free_port()), str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, check=True, cwd=repo, env=env, timeout=600)
    results = json.loads(out.read_text())
    assert len(results) == 2
    assert_bit_exact(results)


@pytest.mark.slow  # training runs
def test_each_run_resumes_from_its_own_checkpoints_bit_exactly(tiny_model, tmp_path, world_of_one):
    """A pool trains a and b to step 4, each checkpointing steps 2 and 4 under its own root; a
    new pool (the trainer restarted) resumes both from step 2 and trains steps 3 and 4 again,
    in another order: the same adapters, optimizer states, losses and published files (step 2
    republished from the checkpoint)."""
    ports = {"a": free_port(), "b": free_port()}

    def add(pool, out, name, resume_step=None):
        ckpt = CheckpointConfig(url=str(tmp_path / "checkpoints" / name), interval=2, resume_step=resume_step)
        config = run_config(tiny_model, out, name, ports[name], max_steps=4, ckpt=ckpt)
        pool.add_run(name, config, client_of(config), publisher_of(config, 0), TrainerCheckpointer(ckpt.url, ckpt, 0),
                     RecordingMetrics())

    servers = [Server(StepBatches(RUNS[name]["seed"]), port) for name, port in ports.items()]
    for server in servers:
        server.__enter__()
    try:
        first = MultiRunTrainer.build(pool_config(tiny_model, tmp_path))
        for name in ("a", "b"):
            add(first, tmp_path / "first", name)
        for names in (["a"], ["a", "b"], ["b", "a"], ["b"], ["a", "b"]):
            first.train_step(names)
        expected = {name: Trained.pooled(first, name) for name in ("a", "b")}
        restarted = MultiRunTrainer.build(pool_config(tiny_model, tmp_path))
        for name in ("b", "a"):
            add(restarted, tmp_path / "restarted", name, resume_step=2)
        assert {name: member.step for name, member in restarted.members.items()} == {"a": 2, "b": 2}
        for names in (["b", "a"], ["a", "b"]):
            restarted.train_step(names)
        found = [d for name in ("a", "b") for d in differences(name, expected[name], Trained.pooled(restarted, name),
                                                                0, logged=(3, 4), published=(2, 3, 4))]
        assert found == []
        assert expected["a"].adapter.keys() == expected["b"].adapter.keys()
        assert not any(torch.equal(v, expected["b"].adapter[k]) for k, v in expected["a"].adapter.items())
        for name in ("a", "b"):
            first.remove_run(name)
        restarted.close()
    finally:
        for server in servers:
            server.__exit__(None, None, None)


def test_a_run_that_does_not_fit_the_pool_is_refused_naming_the_field(tiny_model, tmp_path, world_of_one):
    pool = MultiRunTrainer.build(TrainerConfig(output_dir=tmp_path, model={"name": str(tiny_model)}, device="cpu",
                                               lora={"rank": 8}))
    try:
        base = {"output_dir": tmp_path / "a", "model": {"name": str(tiny_model)}, "device": "cpu"}
        for fields, reason in [({"lora": {"rank": 4}}, r"trainer\.lora\.rank: 4 is not the pool's 8"),
                               ({}, r"trainer\.lora: a pool member trains a LoRA adapter"),
                               ({"lora": {"rank": 8, "target_modules": ["q_proj"]}}, r"trainer\.lora\.target_modules"),
                               ({"lora": {"rank": 8}, "parallel": {"reshard_after_forward": False}}, r"trainer\.parallel")]:
            with pytest.raises(ValueError, match=rf"^run 'a': {reason}"):
                pool.add_run("a", TrainerConfig(**base, **fields), None, None)
        assert pool.members == {}
    finally:
        pool.close()
