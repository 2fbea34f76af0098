"""A missing dev dependency skips a test with its reason, and fails it under `CI=true`
(tests/fixtures/prerequisites.py): run as CI runs it, a test file whose module is hidden."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# pytest on a test file that imports matplotlib, in a process where that import fails.
HIDDEN_MATPLOTLIB = """
import sys, pytest
sys.modules["matplotlib.image"] = None
sys.exit(pytest.main(["-ra", "-q", "-p", "no:cacheprovider", "tests/test_plot.py"]))
"""
REASON = "import of matplotlib.image halted; None in sys.modules (rlkube plot needs matplotlib (rlkube[plot]))"


@pytest.mark.parametrize(("ci", "outcome"), [("true", "1 error"), ("", "1 skipped")])
def test_a_missing_module_skips_with_its_reason_and_fails_under_ci(ci, outcome):
    env = os.environ | {"CI": ci}
    done = subprocess.run([sys.executable, "-c", HIDDEN_MATPLOTLIB], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    failed = done.returncode in (pytest.ExitCode.TESTS_FAILED, pytest.ExitCode.INTERRUPTED)
    assert failed == bool(ci) and outcome in done.stdout, done.stdout[-2000:]
    summary = done.stdout.split("short test summary info")[-1]
    assert "tests/test_plot.py" in summary and REASON in summary, done.stdout[-2000:]
