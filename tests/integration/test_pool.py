"""`rlkube pool` end to end, for real: the pool trainer and one vLLM server with LoRA, and three
tiny member runs on them (reverse_text, verifiers rollouts). Members a and b train to their
ends, each in its own directory with its own metrics, checkpoints and adapter; member c's
orchestrator is SIGKILLed after its first step: c fails alone, a and b finish, and the
launcher exits 1 naming c."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rlkube.metrics import read_metrics

from tests.fixtures.inference import free_port

pytestmark = pytest.mark.slow

STEPS = 3


def pool_toml(tmp_path: Path, model: Path) -> Path:
    path = tmp_path / "pool.toml"
    path.write_text(f'output_dir = "{tmp_path}/pool"\n[model]\nname = "{model}"\n'
                    '[trainer]\ndevice = "cpu"\ncpu_threads = 1\n[trainer.lora]\nrank = 8\n'
                    f'[pool]\nmax_runs = 3\nport = {free_port()}\nmember_grace_s = 20\n'
                    f'[inference]\nport = {free_port()}\nmax_model_len = 512\nkv_cache_space_gb = 1\nenforce_eager = true\n')
    return path


def run_toml(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(f'max_steps = {STEPS}\n[ckpt]\ninterval = {STEPS}\n'
                    '[trainer]\ndevice = "cpu"\ncpu_threads = 1\nmicro_batch_size = 4\n[trainer.lora]\nrank = 8\n'
                    '[trainer.optim]\nlr = 1e-3\n'
                    '[orchestrator]\nbatch_size = 16\ngroup_size = 8\nseq_len = 256\n'
                    '[orchestrator.sampling]\nmax_tokens = 16\ntemperature = 1.0\n'
                    '[[orchestrator.envs]]\nid = "reverse_text"\nargs = { num_examples = 200 }\n'
                    '[orchestrator.eval]\ninterval = 1000\nnum_examples = 8\n[orchestrator.eval.sampling]\nmax_tokens = 16\n'
                    '[weights]\ntype = "storage"\n')
    return path


def started_pids(log: Path) -> dict[str, int]:
    text = log.read_text() if log.exists() else ""
    return {name: int(pid) for name, pid in re.findall(r"started (\S+) \(pid (\d+)\)", text)}


def test_three_members_on_one_pool_one_killed(tmp_path, tiny_model):
    pool, run, out = pool_toml(tmp_path, tiny_model), run_toml(tmp_path), tmp_path / "pool"
    members = {name: ["--run", name, "@", str(run), "--rollouts.port", str(free_port()),
                      "--orchestrator.http-port", str(free_port()), "--seed", str(seed)]
               for seed, name in enumerate("abc")}
    cmd = [sys.executable, "-m", "rlkube.entrypoints.pool", "@", str(pool), *[a for m in members.values() for a in m]]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 900
        c_metrics = out / "members" / "c" / "metrics" / "trainer.jsonl"
        while not c_metrics.exists():
            assert process.poll() is None, f"rlkube pool exited ({process.returncode}) before c's first step"
            assert time.monotonic() < deadline, "timed out waiting for member c's first step"
            time.sleep(0.5)
        os.kill(started_pids(out / "logs" / "pool.log")["c/orchestrator"], signal.SIGKILL)
        output, _ = process.communicate(timeout=900)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.communicate(timeout=60)
    assert process.returncode == 1, output[-4000:]
    assert re.search(r"member c failed: c/orchestrator killed by signal 9", output), output[-4000:]
    assert "members finished: a, b; failed: c" in output or "members finished: b, a; failed: c" in output
    status = json.loads((out / "pool_status.json").read_text())
    assert status["left"]["a"] == status["left"]["b"] == "finished", status
    for name in "ab":
        member = out / "members" / name
        assert [r["step"] for r in read_metrics(member, "trainer")] == list(range(1, STEPS + 1))
        evals = [r for r in read_metrics(member, "orchestrator") if "eval/reward" in r]
        assert [r["step"] for r in evals] == [0, STEPS], "its eval at step 0 and at its last step"
        assert (member / "checkpoints" / "trainer" / f"step_{STEPS}").is_dir()
        assert (member / "weights" / f"step_{STEPS}" / "adapter_model.safetensors").is_file()
        assert (member / "configs" / "trainer.toml").is_file() and (member / "logs" / "orchestrator.log").is_file()
    assert not any(p.poll() is None for p in [process]), "the launcher is gone"
    for name, pid in started_pids(out / "logs" / "pool.log").items():
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", \
            f"{name} (pid {pid}) outlived the launcher"
    if importlib_available("matplotlib"):
        plotted = subprocess.run([sys.executable, "-m", "rlkube.entrypoints.main", "plot", str(out / "members" / "a")],
                                 check=False, env=env, capture_output=True, text=True, timeout=300)
        assert plotted.returncode == 0, plotted.stderr
        assert (out / "members" / "a" / "plots").is_dir()


def importlib_available(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
