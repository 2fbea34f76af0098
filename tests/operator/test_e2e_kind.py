"""End-to-end on a kind cluster (e2e/run.sh): SFTRun then RLRun on CPUs, both Succeeded."""

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.k8s
SCRIPT = Path(__file__).resolve().parents[2] / "e2e" / "run.sh"


def _missing() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if subprocess.run(["docker", "info"], check=False, capture_output=True).returncode != 0:
        return "the Docker daemon is not reachable"
    return None


def test_reverse_text_sft_then_rl_succeed_on_kind():
    if (reason := _missing()) is not None:
        pytest.skip(f"e2e needs docker, kind and kubectl: {reason}")
    result = subprocess.run(["bash", str(SCRIPT)], check=False, capture_output=True, text=True, timeout=3 * 3600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    reward = float(result.stdout.strip().splitlines()[-1].removeprefix("reward="))
    assert reward > 0
