"""The SFT trainer end to end on a very small model: resume, crash safety, torchrun, export."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlkube.checkpoints import MARKER, complete_steps
from rlkube.metrics import read_metrics

pytestmark = pytest.mark.slow

PY = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    from rlkube.models.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("sft") / "model", layers=2, hidden=64, heads=2, kv_heads=1)


def sft_args(model: Path, out: Path, max_steps: int, *extra: str) -> list[str]:
    return [
        "--model.name", str(model), "--output-dir", str(out), "--max-steps", str(max_steps),
        "--data.batch-size", "8", "--data.seq-len", "128", "--micro-batch-size", "2",
        "--data.args", "{num_examples = 64}", "--optim.lr", "3e-3", "--scheduler.warmup-steps", "2",
        *extra,
    ]


def checkpoints(out: Path) -> list[int]:
    """The SFT run's complete checkpoint steps."""
    return complete_steps(out / "checkpoints", ("trainer",))


def run_sft(args: list[str], nproc: int = 1, timeout: int = 300) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    if nproc == 1:
        cmd = [PY, "-m", "rlkube.entrypoints.sft", *args]
    else:
        cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "-m", "rlkube.entrypoints.sft", *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out, "sft")}


@pytest.fixture(scope="module")
def reference_run(small_model, tmp_path_factory) -> Path:
    """6 uninterrupted steps on one process."""
    out = tmp_path_factory.mktemp("sft") / "reference"
    run_sft(sft_args(small_model, out, 6))
    return out


def test_training_lowers_the_loss_and_exports_loadable_weights(reference_run):
    curve = losses(reference_run)
    assert sorted(curve) == [1, 2, 3, 4, 5, 6]
    assert curve[6] < curve[1] - 0.5
    from transformers import AutoModelForCausalLM, AutoTokenizer

    weights = reference_run / "weights" / "step_6"
    model = AutoModelForCausalLM.from_pretrained(weights)
    assert model.config.num_hidden_layers == 2
    assert AutoTokenizer.from_pretrained(weights).chat_template is not None
    assert (weights / "rlkube_model.json").is_file()  # the renderer hint travels with the weights
    assert (reference_run / "weights" / "final").resolve() == weights.resolve()


def test_resumed_run_follows_the_uninterrupted_loss_curve(small_model, reference_run, tmp_path):
    out = tmp_path / "resumed"
    run_sft(sft_args(small_model, out, 3, "--ckpt.interval", "3"))
    assert checkpoints(out) == [3]
    run_sft(sft_args(small_model, out, 6, "--ckpt.resume-step", "latest"))
    reference, resumed = losses(reference_run), losses(out)
    assert [s for s in sorted(resumed)] == [1, 2, 3, 4, 5, 6]  # 1-3 then 4-6 appended
    for step in range(1, 7):
        assert resumed[step] == pytest.approx(reference[step], rel=1e-4), step


def test_two_process_torchrun_matches_one_process(small_model, reference_run, tmp_path):
    out = tmp_path / "ddp"
    run_sft(sft_args(small_model, out, 3, "--ckpt.interval", "3"), nproc=2)
    reference, two = losses(reference_run), losses(out)
    for step in (1, 2, 3):
        assert two[step] == pytest.approx(reference[step], rel=1e-3), step
    shards = sorted(p.name for p in (out / "checkpoints" / "trainer" / "step_3").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard
    assert (out / "weights" / "step_3" / "model.safetensors").is_file()


def unmarked(root: Path) -> list[Path]:
    """Step parts a save has begun and not (yet) marked complete."""
    return [p for p in root.glob("trainer/step_*") if not (p / MARKER).exists()]


def test_a_kill_during_saving_leaves_no_checkpoint_resume_would_pick(small_model, tmp_path):
    """SIGKILL the trainer the moment a save begins; whatever it left, every `step_N` resume
    can see is complete, and resuming from the latest one finishes the run."""
    out = tmp_path / "killed"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [PY, "-m", "rlkube.entrypoints.sft", *sft_args(small_model, out, 40, "--ckpt.interval", "1")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    root = out / "checkpoints"
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if checkpoints(out) and unmarked(root):
                break  # a save (after the first complete one) is in progress
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the trainer finished before it could be killed"
    for step in checkpoints(out):
        assert (root / "trainer" / f"step_{step}" / ".metadata").is_file(), step
        assert (root / "trainer" / f"step_{step}" / "train_state.json").is_file(), step
    latest = checkpoints(out)[-1]
    run_sft(sft_args(small_model, out, latest + 1, "--ckpt.resume-step", "latest"))
    assert checkpoints(out)[-1] == latest + 1
    assert not unmarked(root), "the next save replaced the torn one"
    assert max(losses(out)) == latest + 1


def test_bench_mode_with_activation_checkpointing_prints_tokens_per_second(small_model, tmp_path):
    result = run_sft(sft_args(small_model, tmp_path / "bench", 2, "--bench", "--parallel.activation-checkpointing"))
    assert "bench:" in result.stdout and "tokens/s" in result.stdout
    assert not (tmp_path / "bench" / "weights").exists()


def test_rank0_serves_its_progress_while_it_trains(small_model, tmp_path):
    """GET /status, what the operator shows in `kubectl get sftruns`, follows the run."""
    import httpx

    from tests.fixtures.inference import free_port

    port = free_port()
    out = tmp_path / "status"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    args = sft_args(small_model, out, 20, "--ckpt.interval", "10", "--status-port", str(port))
    # stderr to a file: a pipe nobody reads while polling could fill and stall the trainer
    log = tmp_path / "sft.stderr"
    with log.open("w") as stderr:
        proc = subprocess.Popen([PY, "-m", "rlkube.entrypoints.sft", *args], env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr)
    seen = []
    deadline = time.monotonic() + 240
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            seen.append(httpx.get(f"http://127.0.0.1:{port}/status", timeout=2).json())
        except httpx.HTTPError:
            pass  # not serving yet, or already closed
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()[-4000:]
    steps = [s["step"] for s in seen]
    assert steps == sorted(steps) and len(set(steps)) >= 3 and max(steps) <= 20, steps
    assert {s["max_steps"] for s in seen} == {20} and {s["phase"] for s in seen} <= {"running", "finished"}
    assert all(isinstance(s["loss"], float) for s in seen if s["step"] > 0)
    assert {s["last_checkpoint_step"] for s in seen} & {10, 20}
    # a checkpoint is reported once saved: at most the step, and one of the interval's
    assert all(s["last_checkpoint_step"] in (None, *range(10, s["step"] + 1, 10)) for s in seen), seen
