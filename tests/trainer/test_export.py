"""`rlkube export` (rlkube.trainer.export) on runs of the real trainers on the tiny model: the
exported directory loads with transformers and computes the trainer's policy of that step, from
checkpoints and from storage snapshots, full and LoRA (merged and adapter), in any dtype; bad
input exits 2 naming the field."""

import dataclasses
import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import fsspec
import pytest
import torch
from rlkube import manifest
from rlkube.checkpoints import MARKER
from rlkube.config import TrainerConfig, write_toml
from rlkube.entrypoints.export import main as export_main
from rlkube.models.lora_math import PEFT_PREFIX, merged_weights
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.packed import policy_logprobs
from rlkube.trainer.rl.setup import build_training_env
from rlkube.trainer.rl.trainer import RLTrainer
from rlkube.transport.client import RolloutClient
from rlkube.transport.weights import StoragePublisher
from rlkube.transport.weights_delta import DeltaPublisher
from safetensors.torch import load_file

from tests.conftest import restored_environment
from tests.fixtures.inference import S3_BUCKET, S3_ENV, free_port
from tests.trainer.conftest import one_rank_world
from tests.trainer.rl.test_trainer import RecordingMetrics, Server, SyntheticSource, synthetic_batch

RANK, ALPHA = 8, 16.0


class Recording:
    """A publisher that also keeps each policy it is given (in memory)."""

    def publish(self, state_dict, step):
        self.published = getattr(self, "published", {}) | {step: {k: v.clone() for k, v in state_dict.items()}}
        return super().publish(state_dict, step)


class RecordingStorage(Recording, StoragePublisher):
    pass


class RecordingDelta(Recording, DeltaPublisher):
    pass


def train_rl(config: TrainerConfig) -> RLTrainer:
    """4 steps of the RL trainer on a synthetic batch over real gRPC, publishing to storage (as
    deltas with `weights.delta`) and checkpointing at steps 2 and 4, with the config written
    where `rlkube rl` writes it."""
    from rlkube.trainer.lora import adapter_config

    write_toml(config, config.output_dir / "configs" / "trainer.toml")
    env = build_training_env(config)
    lora = adapter_config(config.lora, config.model.name) if config.lora else None
    storage = (StoragePublisher if config.weights.delta else RecordingStorage)(
        str(config.output_dir / "weights"), config.model.name, keep_last=None, adapter_config=lora)
    publisher = (RecordingDelta(storage, config.model.name, config.weights.delta.full_every, final_step=config.max_steps)
                 if config.weights.delta else storage)
    trainer = RLTrainer(config, env, RolloutClient(f"127.0.0.1:{config.rollouts.port}", timeout_s=60), publisher,
                        TrainerCheckpointer(config.output_dir / "checkpoints", config.ckpt, env.rank), RecordingMetrics())
    batch = synthetic_batch(torch.Generator().manual_seed(0))
    with torch.no_grad():
        batch["inference_logprobs"] = policy_logprobs(trainer.model, batch)[0].float()
    with Server(SyntheticSource(batch), config.rollouts.port):
        trainer.train()
    trainer.publishing.close()
    return trainer


def rl_config(tiny_model, out: Path, **extra) -> TrainerConfig:
    return TrainerConfig(
        output_dir=out, model={"name": str(tiny_model)}, max_steps=4, device="cpu", ckpt={"interval": 2},
        loss={"kl_tau": 0.0}, rollouts={"port": free_port(), "timeout_s": 60}, **({"optim": {"lr": 3e-3}} | extra),
    )


def export(*args: str) -> int:
    return export_main([str(a) for a in args])


BATCH = synthetic_batch(torch.Generator().manual_seed(3))
"""Two packed samples the trainer never trained on."""


def logprobs(model) -> torch.Tensor:
    """The model's log-probs of BATCH's completion tokens, as the trainer computes them."""
    with torch.no_grad():
        return policy_logprobs(model, BATCH)[0].float()


def load_model(path: Path, dtype=torch.float32):
    """The export loaded with transformers, attending as the trainer does (packed rows)."""
    from rlkube.trainer.rl.attention import register
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=register())


@dataclasses.dataclass(frozen=True)
class FullRun:
    """A finished full-weight `train_rl` run: its directory, its config, the policy it published at
    each step, and the final policy's log-probs of BATCH."""

    run: Path
    config: TrainerConfig
    published: dict[int, dict[str, torch.Tensor]]
    logprobs: torch.Tensor


@pytest.fixture(scope="module")
def trained_run(tiny_model, tmp_path_factory) -> FullRun:
    """One run for the module: the tests that export it read it through `full_run`'s copy."""
    with restored_environment(), pytest.MonkeyPatch.context() as monkeypatch, one_rank_world(monkeypatch):
        trainer = train_rl(rl_config(tiny_model, tmp_path_factory.mktemp("export") / "run"))
        return FullRun(trainer.config.output_dir, trainer.config, trainer.publisher.published, logprobs(trainer.model))


@pytest.fixture
def full_run(trained_run, tmp_path) -> FullRun:
    """A copy of the module's run, which the test may change (its config names the original's
    `output_dir`; `rlkube export --run` reads the copy)."""
    shutil.copytree(trained_run.run, tmp_path / "run")
    return dataclasses.replace(trained_run, run=tmp_path / "run")


def test_a_full_run_exports_each_checkpointed_policy_bit_exact(full_run, tmp_path):
    run = full_run.run
    for step in (2, 4):
        assert export("--run", run, "--step", step, "--dtype", "float32", "--out", tmp_path / f"step_{step}") == 0
        exported = load_file(tmp_path / f"step_{step}" / "model.safetensors")
        policy = full_run.published[step]
        assert exported.keys() == policy.keys(), "the tied head is the embedding: written once"
        assert all(torch.equal(exported[k], policy[k]) for k in policy), step
    assert not torch.equal(full_run.published[2]["model.norm.weight"],
                           full_run.published[4]["model.norm.weight"]), "the steps differ"
    model = load_model(tmp_path / "step_4")
    assert torch.equal(logprobs(model), full_run.logprobs), "the export computes the trainer's policy"
    assert (tmp_path / "step_4" / "tokenizer_config.json").is_file() and (tmp_path / "step_4" / "rlkube_model.json").is_file()


def test_the_default_is_the_newest_checkpoint_in_the_base_dtype_and_bfloat16_rounds_it(full_run, tmp_path):
    run = full_run.run
    assert export("--run", run) == 0  # the tiny model is float32
    default = run / "export" / "step_4"
    assert torch.equal(logprobs(load_model(default)), full_run.logprobs)
    assert export("--run", run, "--dtype", "bfloat16", "--out", tmp_path / "bf16") == 0
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    exported, policy = load_file(tmp_path / "bf16" / "model.safetensors"), full_run.published[4]
    assert all(torch.equal(exported[k], policy[k].to(torch.bfloat16)) for k in policy)
    bf16, f32 = logprobs(load_model(tmp_path / "bf16", dtype=torch.bfloat16)), full_run.logprobs
    assert not torch.equal(bf16, f32)
    torch.testing.assert_close(bf16, f32, rtol=0.05, atol=0.05)


def test_a_storage_snapshot_exports_the_same_model_as_the_checkpoint(full_run, tmp_path):
    run = full_run.run
    assert export("--run", run, "--source", "weights", "--out", tmp_path / "from_weights") == 0
    assert export("--run", run, "--out", tmp_path / "from_ckpt") == 0
    a, b = (load_file(tmp_path / name / "model.safetensors") for name in ("from_weights", "from_ckpt"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_delta_snapshot_exports_applied_to_its_bases(tiny_model, tmp_path, world_of_one):
    """A bfloat16 wire at a small learning rate changes few elements a step: steps 2 and 3 travel
    as deltas, which the export applies to step 1's full snapshot."""
    trainer = train_rl(rl_config(tiny_model, tmp_path / "run", optim={"lr": 1e-5},
                                 weights={"dtype": "bfloat16", "delta": {"full_every": 10}}))
    run = trainer.config.output_dir
    assert json.loads((run / "weights" / "step_3" / "COMPLETE").read_text())["base"] == 2, "step 3 is a delta"
    assert export("--run", run, "--source", "weights", "--step", 3, "--dtype", "bfloat16", "--out", tmp_path / "step_3") == 0
    exported, policy = load_file(tmp_path / "step_3" / "model.safetensors"), trainer.publisher.published[3]
    assert exported.keys() == policy.keys() and all(torch.equal(exported[k], policy[k]) for k in policy)
    assert any(not torch.equal(policy[k], trainer.publisher.published[1][k]) for k in policy), "step 3 moved"


def test_an_moe_checkpoint_exports_its_stacked_experts_one_linear_layer_each(tiny_moe_model, tmp_path, world_of_one):
    """The trainer holds each MoE block's experts stacked (rlkube.trainer.experts); the export
    has the checkpoint layout the model came in, which vLLM and transformers read."""
    config = rl_config(tiny_moe_model, tmp_path / "run")
    write_toml(config, config.output_dir / "configs" / "trainer.toml")
    env = build_training_env(config)
    assert any(name.endswith("experts.gate_up_proj") for name, _ in env.model.named_parameters())
    TrainerCheckpointer(config.output_dir / "checkpoints", config.ckpt, env.rank).save(1, env.model, env.optimizer, env.scheduler)
    assert export("--run", config.output_dir, "--out", tmp_path / "moe") == 0
    exported, base = load_file(tmp_path / "moe" / "model.safetensors"), load_file(Path(tiny_moe_model) / "model.safetensors")
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in exported
    assert exported.keys() == base.keys() and all(torch.equal(exported[k], base[k]) for k in base), "the untrained model"


def test_bad_input_exits_2_naming_the_field(full_run, tmp_path, capsys):
    run = full_run.run
    (run / "checkpoints" / "trainer" / "step_2" / MARKER).unlink()
    assert export("--run", run, "--step", 2) == 2
    assert "step: " in (err := capsys.readouterr().err) and "has no COMPLETE marker" in err and "complete steps: [4]" in err
    assert export("--run", run, "--lora", "merge") == 2
    assert "lora: " in capsys.readouterr().err
    assert export("--run", tmp_path / "nothing") == 2
    assert "run: " in capsys.readouterr().err
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "not_a_model" / "notes.txt").write_text("keep me")
    assert export("--run", run, "--out", tmp_path / "not_a_model") == 2
    assert (tmp_path / "not_a_model" / "notes.txt").read_text() == "keep me"
    (run / "configs" / "trainer.toml").rename(tmp_path / "trainer.toml")
    assert export("--run", run) == 2
    assert "holds no configs/trainer.toml or configs/sft.toml" in capsys.readouterr().err
    assert export("--run", run, "--config", tmp_path / "trainer.toml", "--out", tmp_path / "named") == 0
    empty = tmp_path / "empty"
    (empty / "configs").mkdir(parents=True)
    write_toml(full_run.config, empty / "configs" / "trainer.toml")
    assert export("--run", empty) == 2
    assert "no complete checkpoint" in capsys.readouterr().err


def test_a_planted_altered_or_unsigned_checkpoint_is_refused_naming_the_file(full_run, tmp_path, capsys, monkeypatch):
    """The export unpickles the part's DCP metadata as a resume does, so it checks the part's
    manifest first (rlkube.manifest): with the run's key set, its signature too."""
    run, part = full_run.run, full_run.run / "checkpoints" / "trainer" / "step_4"
    planted = part / "dcp" / "__9_0.distcp"
    planted.write_bytes(b"pickled code")
    assert export("--run", run, "--out", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert f"refused {planted}" in err and "does not list it (a file planted after the save)" in err, err
    assert not (tmp_path / "out").exists()
    planted.unlink()
    metadata = part / "dcp" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:-1] + b"\0")
    assert export("--run", run, "--out", tmp_path / "out") == 2
    assert f"refused {metadata}: its SHA-256 differs" in capsys.readouterr().err

    shutil.copyfile(full_run.config.output_dir / "checkpoints" / "trainer" / "step_4" / "dcp" / ".metadata", metadata)
    manifest_file = part / manifest.MANIFEST
    listed = json.loads(manifest_file.read_text())["files"]
    monkeypatch.setenv(manifest.KEY_ENV, "the run's key")
    assert export("--run", run, "--out", tmp_path / "out") == 2, "the run's trainer signed nothing"
    assert f"refused {manifest_file}: its signature does not match" in capsys.readouterr().err
    manifest_file.write_bytes(manifest.manifest_bytes(listed, "trainer/step_4", b"the run's key"))
    assert export("--run", run, "--out", tmp_path / "out") == 0, capsys.readouterr().err
    monkeypatch.setenv(manifest.KEY_ENV, "another run's key")
    assert export("--run", run, "--out", tmp_path / "out") == 2
    assert f"refused {manifest_file}: its signature does not match" in capsys.readouterr().err


def test_an_export_to_an_object_store_loads_and_replaces_only_a_model(full_run, tmp_path, moto_s3, monkeypatch, capsys):
    """`--out s3://…` (fsspec, the store's credentials from the environment): the model
    directory downloaded from the store computes the trainer's policy."""
    for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": moto_s3}.items():
        monkeypatch.setenv(key, value)
    url = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/model"
    fs, path = fsspec.core.url_to_fs(url)
    for attempt in range(2):  # the second replaces the first
        assert export("--run", full_run.run, "--step", 2 + 2 * attempt, "--out", url) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.strip() == f"wrote {url}"
    fs.get(path, str(tmp_path / "model"), recursive=True)
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= {p.name for p in (tmp_path / "model").iterdir()}
    assert torch.equal(logprobs(load_model(tmp_path / "model")), full_run.logprobs), "step 4's policy"

    fs.pipe_file(f"{path}-notes/notes.txt", b"keep me")
    assert export("--run", full_run.run, "--out", f"{url}-notes") == 2
    assert f"out: {url}-notes exists and is no model directory" in capsys.readouterr().err
    assert fs.cat_file(f"{path}-notes/notes.txt") == b"keep me"


def test_a_lora_run_exports_the_merged_model_and_its_adapter(tiny_model, tmp_path, world_of_one):
    trainer = train_rl(rl_config(tiny_model, tmp_path / "run", lora={"rank": RANK, "alpha": ALPHA}))
    run = trainer.config.output_dir
    assert export("--run", run, "--lora", "adapter", "--dtype", "float32", "--out", tmp_path / "adapter") == 0
    assert sorted(p.name for p in (tmp_path / "adapter").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    adapter, policy = load_file(tmp_path / "adapter" / "adapter_model.safetensors"), trainer.publisher.published[4]
    assert adapter.keys() == policy.keys() and all(torch.equal(adapter[k], policy[k]) for k in policy)
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == RANK

    assert export("--run", run, "--out", tmp_path / "merged") == 0
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    base = load_file(Path(tiny_model) / "model.safetensors")
    module = "model.layers.0.self_attn.q_proj"
    by_hand = merged_weights(base, {k: v for k, v in adapter.items() if k.startswith(PEFT_PREFIX + module + ".")},
                             ALPHA / RANK)
    assert torch.equal(merged[f"{module}.weight"], by_hand[f"{module}.weight"]), "W + alpha/r * B @ A"
    assert not torch.equal(merged[f"{module}.weight"], base[f"{module}.weight"]), "the adapters trained"
    torch.testing.assert_close(logprobs(load_model(tmp_path / "merged")), logprobs(trainer.model), rtol=1e-4, atol=1e-4)

    assert export("--run", run, "--source", "weights", "--lora", "adapter", "--out", tmp_path / "adapter_w") == 0
    assert load_file(tmp_path / "adapter_w" / "adapter_model.safetensors").keys() == adapter.keys()


@pytest.mark.slow
def test_an_sft_run_exports_through_the_cli_what_it_wrote_itself(tmp_path):
    """The `rlkube export` command on an SFT checkpoint (DCP under `app.model.`): the weights the
    SFT trainer itself exported at that step."""
    from rlkube.models.tiny import init_tiny_model

    from tests.trainer.test_sft_train import run_sft, sft_args

    model = init_tiny_model(tmp_path / "model", layers=2, hidden=64, heads=2, kv_heads=1)
    run = tmp_path / "sft"
    run_sft(sft_args(model, run, 2, "--ckpt.interval", "2"))
    result = subprocess.run([sys.executable, "-m", "rlkube.entrypoints.main", "export", "--run", str(run)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith(str(run / "export" / "step_2"))
    exported = load_file(run / "export" / "step_2" / "model.safetensors")
    own = load_file(run / "weights" / "step_2" / "model.safetensors")
    assert exported.keys() == own.keys() and all(torch.equal(exported[k], own[k]) for k in own)
