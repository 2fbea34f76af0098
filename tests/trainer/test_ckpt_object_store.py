"""Trainer checkpoints (RL and SFT) through fsspec with real torch DCP, on a local directory and
on S3 (moto): resume picks the newest step whose parts are all marked COMPLETE, a save killed
midway is never picked, `latest` with nothing complete starts fresh, and shards written by two
gloo ranks load into one."""

import os
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch
from rlkube.checkpoints import complete_steps, is_complete, part_dir, unmark
from rlkube.config import CheckpointConfig, TrainerConfig
from rlkube.orchestrator import checkpoint as orchestrator_checkpoint
from rlkube.trainer.ckpt import CheckpointManager
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer

from tests.fixtures.storage import ckpt_root  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def config_for(tiny_model, tmp_path, root, **ckpt) -> TrainerConfig:
    return TrainerConfig(output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=8, device="cpu",
                         ckpt={"url": root, **ckpt})


def nudge(env, seed: int) -> None:
    """One optimizer step (gradients as sharded as the weights): new weights and optimizer state."""
    for param in env.model.parameters():
        param.grad = torch.ones_like(param) * (seed % 5 - 2.5)
    env.optimizer.step()
    env.scheduler.step()


def assert_weights_equal(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    bad = {n: (actual[n] - t).abs().max().item() for n, t in expected.items() if not torch.equal(actual[n], t)}
    assert not bad, bad


def weights_of(env) -> dict:
    """A copy of the full weights (one rank's full_state_dict may alias the live parameters)."""
    return {name: tensor.clone() for name, tensor in env.full_state_dict().items()}


def files_of(url: str) -> set[str]:
    fs, path = fsspec.core.url_to_fs(url)
    return {p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)}


def test_rl_resume_picks_the_newest_step_both_processes_completed(tiny_model, tmp_path, world_of_one, ckpt_root):  # noqa: F811
    config = config_for(tiny_model, tmp_path, ckpt_root, keep_last=3)
    env = build_training_env(config)
    checkpointer = TrainerCheckpointer(ckpt_root, config.ckpt, env.rank)
    saved = {}
    for step in (2, 4, 6, 8):
        nudge(env, step)
        checkpointer.save(step, env.model, env.optimizer, env.scheduler)
        saved[step] = weights_of(env)
        if step != 6:
            orchestrator_checkpoint.save(ckpt_root, step, {"policy_step": step})
    fs, path = fsspec.core.url_to_fs(part_dir(ckpt_root, 6, "orchestrator"))
    fs.makedirs(path, exist_ok=True)
    fs.pipe_file(f"{path}/state.json", b"{}")  # the orchestrator was killed before its marker
    unmark(ckpt_root, 8, "trainer")  # the trainer was killed after its shards, before its marker
    assert {"dcp", "progress.json", "COMPLETE"} <= files_of(part_dir(ckpt_root, 4, "trainer"))
    assert ".metadata" in files_of(f"{part_dir(ckpt_root, 8, 'trainer')}/dcp"), "the shards of 8 are there"
    assert not fs.exists(fs._strip_protocol(f"{ckpt_root}/step_2")), "keep_last=3 pruned the whole of step 2"

    resumed = build_training_env(config)
    checkpointer = TrainerCheckpointer(ckpt_root, config.ckpt, resumed.rank)
    assert checkpointer.resolve("latest") == 4
    assert orchestrator_checkpoint.resolve_step(ckpt_root, "latest") == 4, "the orchestrator resolves the same"
    assert checkpointer.load(4, resumed.model, resumed.optimizer, resumed.scheduler) == 4
    assert_weights_equal(resumed.full_state_dict(), saved[4])
    assert resumed.scheduler.last_epoch == env.scheduler.last_epoch - 2

    checkpointer.abandon_after(4)  # unmark_after: the trainer part of 6 is abandoned, on S3 too
    assert complete_steps(ckpt_root, ("trainer",)) == [4]
    assert complete_steps(ckpt_root, ("orchestrator",)) == [4, 8]
    nudge(resumed, 100)
    checkpointer.save(6, resumed.model, resumed.optimizer, resumed.scheduler)  # re-saving a step
    assert checkpointer.resolve("latest") == 4, "the orchestrator's half of 6 is still missing"
    orchestrator_checkpoint.save(ckpt_root, 6, {"policy_step": 6})
    assert checkpointer.resolve("latest") == 6


def test_latest_with_nothing_complete_starts_the_rl_trainer_fresh(tiny_model, tmp_path, world_of_one, ckpt_root):  # noqa: F811
    config = config_for(tiny_model, tmp_path, ckpt_root, resume_step="latest")
    env = build_training_env(config)
    checkpointer = TrainerCheckpointer(ckpt_root, config.ckpt, env.rank)
    checkpointer.save(2, env.model, env.optimizer, env.scheduler)  # a first attempt's trainer part only
    trainer = RLTrainer(config, env, client=None, publisher=None, checkpointer=checkpointer, metrics=None)
    trainer.resume()  # publishes nothing (the publisher is None): a fresh start
    assert trainer.step == 0
    assert not is_complete(ckpt_root, 2, "trainer"), "a fresh start abandons the earlier attempt's parts"


def test_sft_checkpoints_resume_the_newest_complete_step(tiny_model, tmp_path, world_of_one, ckpt_root):  # noqa: F811
    config = config_for(tiny_model, tmp_path, ckpt_root)
    env = build_training_env(config)
    fresh = CheckpointManager(tmp_path, CheckpointConfig(url=ckpt_root, resume_step="latest"), is_main=True)
    assert fresh.resolve_resume_step() is None, "`latest` with nothing saved starts fresh"

    manager = CheckpointManager(tmp_path, CheckpointConfig(url=ckpt_root), is_main=True)
    nudge(env, 3)
    manager.save(3, env.model, env.optimizer, env.scheduler, {"step": 3, "data": {"epoch": 1}})
    weights = weights_of(env)
    nudge(env, 5)
    manager.save(5, env.model, env.optimizer, env.scheduler, {"step": 5, "data": {"epoch": 2}})
    unmark(ckpt_root, 5, "trainer")  # killed after the shards, before the marker
    assert {".metadata", "train_state.json", "COMPLETE"} <= files_of(part_dir(ckpt_root, 3, "trainer"))

    step = fresh.resolve_resume_step()
    assert step == 3
    resumed = build_training_env(config)
    assert fresh.load(step, resumed.model, resumed.optimizer, resumed.scheduler) == {"step": 3, "data": {"epoch": 1}}
    assert_weights_equal(resumed.full_state_dict(), weights)


@pytest.mark.slow
def test_two_gloo_ranks_save_shards_one_rank_loads(tiny_model, tmp_path, world_of_one, ckpt_root):  # noqa: F811
    out = tmp_path / "weights.pt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(REPO / "tests/trainer/ckpt_rank_worker.py"), str(tiny_model), ckpt_root, str(out)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key)  # world_of_one's, for this process only
    subprocess.run(cmd, check=True, cwd=REPO, env=env, timeout=300)
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= files_of(f"{part_dir(ckpt_root, 1, 'trainer')}/dcp")

    config = config_for(tiny_model, tmp_path, ckpt_root, resume_step="latest")
    one = build_training_env(config)
    checkpointer = TrainerCheckpointer(ckpt_root, config.ckpt, one.rank)
    step = checkpointer.resolve(1)
    assert checkpointer.load(step, one.model, one.optimizer, one.scheduler) == 1
    assert_weights_equal(one.full_state_dict(), torch.load(out))
