"""Attacks on what the trainer loads from the run's volume or store (issue 41, item 2): a
planted DCP checkpoint whose `.metadata` pickle runs code, an altered shard, a signed part moved
to another step, an unsigned or foreign-key part, and a planted compile-cache blob. Each is
refused before torch reads it, naming the file (rlkube.manifest); a signed save resumes
bit-exact."""

import contextlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest
import torch
import torch.distributed.checkpoint as dcp
from rlkube.checkpoints import MARKER, finish_part, part_dir
from rlkube.config import TrainerConfig
from rlkube.manifest import KEY_ENV, MANIFEST, Refused
from rlkube.trainer.compile_cache import cache_key
from rlkube.trainer.rl.checkpoint import TrainerCheckpointer
from rlkube.trainer.rl.setup import build_training_env

from tests.fixtures.storage import ckpt_root  # noqa: F401
from tests.trainer.conftest import world_of_one  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
KEY = "the-run's-checkpoint-key-0123456789abcdef"


class RunsCode:
    """A pickle that, unpickled, creates `path`: what a planted `.metadata` would do (here
    harmlessly, so the test can see whether it ran)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.fixture
def keyed(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)


@pytest.fixture
def saved(keyed, tiny_model, tmp_path, world_of_one, ckpt_root):  # noqa: F811
    """A trainer with a signed step 1 under `ckpt_root`: (env, checkpointer, weights at step 1)."""
    config = TrainerConfig(output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=4, device="cpu",
                           ckpt={"url": ckpt_root})
    env = build_training_env(config)
    for param in env.model.parameters():
        param.grad = torch.full_like(param, 0.5)
    env.optimizer.step()
    env.scheduler.step()
    checkpointer = TrainerCheckpointer(ckpt_root, config.ckpt, env.rank)
    checkpointer.save(1, env.model, env.optimizer, env.scheduler)
    weights = {n: t.clone() for n, t in env.full_state_dict().items()}
    return env, checkpointer, weights


def fs_path(url: str):
    return fsspec.core.url_to_fs(url)


def plant(url: str, data: bytes) -> None:
    """What a program with write access to the volume or the store does."""
    fs, path = fs_path(url)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)


def load(env, checkpointer, step: int = 1) -> int:
    return checkpointer.load(step, env.model, env.optimizer, env.scheduler)


def test_a_planted_metadata_pickle_is_refused_before_it_is_unpickled(saved, tmp_path, ckpt_root):  # noqa: F811
    env, checkpointer, _ = saved
    ran = tmp_path / "payload-ran"
    plant(f"{part_dir(ckpt_root, 1, 'trainer')}/dcp/.metadata", pickle.dumps(RunsCode(ran)))

    with pytest.raises(Refused, match=r"trainer/step_1/dcp/\.metadata: .*the manifest") as refused:
        load(env, checkpointer)
    assert refused.value.path.endswith("trainer/step_1/dcp/.metadata")
    assert not ran.exists(), "the planted pickle ran in the trainer"
    if "://" not in ckpt_root:  # the payload is live: DCP's own reader runs it
        with contextlib.suppress(Exception):  # whatever DCP makes of the file object open() returned
            dcp.FileSystemReader(f"{part_dir(ckpt_root, 1, 'trainer')}/dcp").read_metadata()
        assert ran.exists()


def test_a_planted_step_with_no_manifest_is_refused(saved, tmp_path, ckpt_root):  # noqa: F811
    """A whole step made by someone else (both parts marked COMPLETE): `latest` picks it, and
    loading it is refused, naming its missing manifest."""
    env, checkpointer, _ = saved
    ran = tmp_path / "payload-ran"
    plant(f"{part_dir(ckpt_root, 9, 'trainer')}/dcp/.metadata", pickle.dumps(RunsCode(ran)))
    finish_part(ckpt_root, 9, "trainer", {"progress.json": b'{"step": 9, "scheduler": {}}'})
    finish_part(ckpt_root, 9, "orchestrator", {"state.json": b"{}"})
    step = checkpointer.resolve("latest")
    assert step == 9
    with pytest.raises(Refused, match=rf"trainer/step_9/{MANIFEST}: the part has no manifest"):
        load(env, checkpointer, step)
    assert not ran.exists()


def test_an_altered_shard_is_refused_naming_it(saved, ckpt_root):  # noqa: F811
    env, checkpointer, _ = saved
    fs, part = fs_path(part_dir(ckpt_root, 1, "trainer"))
    shard = f"{part}/dcp/__0_0.distcp"
    data = bytearray(fs.cat_file(shard))
    data[len(data) // 2] ^= 0x01  # one bit of one weight
    fs.pipe_file(shard, bytes(data))
    with pytest.raises(Refused, match=r"trainer/step_1/dcp/__0_0\.distcp: its SHA-256 differs"):
        load(env, checkpointer)


def test_a_planted_extra_file_is_refused_naming_it(saved, ckpt_root):  # noqa: F811
    env, checkpointer, _ = saved
    plant(f"{part_dir(ckpt_root, 1, 'trainer')}/dcp/__7_0.distcp", b"\0" * 64)
    with pytest.raises(Refused, match=r"dcp/__7_0\.distcp: the part's manifest does not list it"):
        load(env, checkpointer)


def test_a_signed_part_copied_to_another_step_is_refused(saved, ckpt_root):  # noqa: F811
    env, checkpointer, _ = saved
    fs, _ = fs_path(ckpt_root)
    fs.copy(fs_path(part_dir(ckpt_root, 1, "trainer"))[1], fs_path(part_dir(ckpt_root, 5, "trainer"))[1], recursive=True)
    with pytest.raises(Refused, match=r"trainer/step_5/MANIFEST.json: it is the manifest of 'trainer/step_1'"):
        load(env, checkpointer, 5)


def test_a_manifest_rewritten_without_the_key_is_refused(saved, ckpt_root):  # noqa: F811
    """The attacker alters a shard and rewrites the manifest to match, signed with a key of
    their own (or left unsigned)."""
    env, checkpointer, _ = saved
    fs, part = fs_path(part_dir(ckpt_root, 1, "trainer"))
    manifest = json.loads(fs.cat_file(f"{part}/{MANIFEST}"))
    for mac in ("0" * 64, None):
        fs.pipe_file(f"{part}/{MANIFEST}", json.dumps(manifest | {"mac": mac}).encode())
        with pytest.raises(Refused, match="its signature does not match the run's checkpoint key"):
            load(env, checkpointer)


def test_a_signed_checkpoint_resumes_bit_exact(saved, ckpt_root):  # noqa: F811
    env, checkpointer, weights = saved
    for param in env.model.parameters():  # move away from step 1's weights
        param.grad = torch.ones_like(param)
    env.optimizer.step()
    assert load(env, checkpointer) == 1
    restored = env.full_state_dict()
    assert all(torch.equal(restored[n], t) for n, t in weights.items())


@pytest.fixture
def unkeyed_save(tiny_model, tmp_path, world_of_one, monkeypatch):  # noqa: F811
    monkeypatch.delenv(KEY_ENV, raising=False)
    root = str(tmp_path / "checkpoints")
    config = TrainerConfig(output_dir=tmp_path, model={"name": str(tiny_model)}, max_steps=4, device="cpu",
                           ckpt={"url": root})
    env = build_training_env(config)
    checkpointer = TrainerCheckpointer(root, config.ckpt, env.rank)
    checkpointer.save(1, env.model, env.optimizer, env.scheduler)
    return env, checkpointer, Path(part_dir(root, 1, "trainer"))


def test_without_a_key_the_part_is_unsigned_and_still_checked_against_its_manifest(unkeyed_save, monkeypatch):
    env, checkpointer, part = unkeyed_save
    assert json.loads((part / MANIFEST).read_text())["mac"] is None
    assert load(env, checkpointer) == 1
    (part / "dcp" / "__0_0.distcp").write_bytes(b"torn")
    with pytest.raises(Refused, match=r"__0_0\.distcp: 4 bytes, the manifest says"):
        load(env, checkpointer)
    monkeypatch.setenv(KEY_ENV, KEY)  # an unsigned part is accepted only while no key is configured
    with pytest.raises(Refused, match="it is unsigned"):
        load(env, checkpointer)


# --- the compile cache ----------------------------------------------------------------------
def run_worker(output_dir: Path, url: str, key: str | None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", KEY_ENV)}
    if key is not None:
        env[KEY_ENV] = key
    done = subprocess.run([sys.executable, str(REPO / "tests/trainer/compile_cache_worker.py"), str(output_dir), url],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.slow
def test_a_planted_compile_cache_blob_is_refused(tmp_path):
    """Artifacts signed with another key (the attacker's), and artifacts with no signature, are
    not loaded: the trainer compiles afresh (no cache hit) and says which file it refused; the
    run's own signed artifacts are loaded by the next pod."""
    store = tmp_path / "store"
    blob = store / f"{cache_key(torch.device('cpu'))}.bin"
    run_worker(tmp_path / "attacker", f"file://{store}", key="not-the-run's-key")
    assert blob.stat().st_size > 0 and blob.with_name(blob.name + ".sig").exists()

    planted, log = run_worker(tmp_path / "pod-a", f"file://{store}", key=KEY)
    assert planted["hits"] == 0 and planted["misses"] >= 1, planted
    assert f"refused file://{blob}: its signature does not match" in log

    blob.with_name(blob.name + ".sig").unlink()
    blob.write_bytes(blob.read_bytes())  # the attacker's artifacts, unsigned
    planted, log = run_worker(tmp_path / "pod-b", f"file://{store}", key=KEY)
    assert planted["hits"] == 0, planted
    assert f"refused file://{blob}: no signature" in log

    run_worker(tmp_path / "pod-c", f"file://{store}", key=KEY)  # signs what it compiled
    ours, log = run_worker(tmp_path / "pod-d", f"file://{store}", key=KEY)
    assert ours["hits"] >= 1 and ours["misses"] == 0 and "refused" not in log, (ours, log)


def test_the_marker_comes_after_the_manifest(saved, ckpt_root):  # noqa: F811
    """The manifest is written before the marker: a save killed between them leaves an
    unmarked part, which nothing resumes from."""
    fs, part = fs_path(part_dir(ckpt_root, 1, "trainer"))
    names = {p.rsplit("/", 1)[-1] for p in fs.ls(part, detail=False)}
    assert {MANIFEST, MARKER, "progress.json", "dcp"} <= names
    listed = json.loads(fs.cat_file(f"{part}/{MANIFEST}"))["files"]
    assert MARKER not in listed and "progress.json" in listed and "dcp/.metadata" in listed


@pytest.mark.slow
def test_rlkube_sft_exits_2_naming_the_file_of_a_refused_checkpoint(tmp_path):
    """Through the entry point: a run resumed past an altered shard stops with exit code 2 (no
    restart fixes it) and says which file, instead of training on from it or from scratch."""
    from rlkube.models.tiny import init_tiny_model

    from tests.trainer.test_sft_train import sft_args

    model = init_tiny_model(tmp_path / "model", layers=2, hidden=64, heads=2, kv_heads=1)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                              "MASTER_PORT")} | {KEY_ENV: KEY, "OMP_NUM_THREADS": "1"}

    def sft(max_steps: int, *extra: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "rlkube.entrypoints.sft", *sft_args(model, out, max_steps, "--ckpt.interval", "1",
                                                                          *extra)]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)

    assert sft(2).returncode == 0
    shard = Path(part_dir(str(out / "checkpoints"), 2, "trainer")) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = sft(3, "--ckpt.resume-step", "latest")
    assert resumed.returncode == 2, resumed.stderr[-3000:]
    assert f"rlkube sft: error: refused {shard}: its SHA-256 differs" in resumed.stderr
