"""Environment code never sees the run's secrets (issue 35, item 3): a program an environment
runs, started by a process that began as `rlkube orchestrator` / `rlkube env-worker` do
(`serve_main`), finds neither the run's token, its scoped credentials nor the object store's credentials in its
environment, nor in its parent's (`/proc/<ppid>/environ`), while the serving process still
has them for its own use."""

import os
import subprocess
import sys

from rlkube.withheld import CHECKPOINT_KEY_ENV, CREDENTIAL_ENVS, STORE_CREDENTIALS, TOKEN_ENV

SECRETS = {TOKEN_ENV: "the-run-token-1234", **{name: f"scoped-credential-{name}" for name in CREDENTIAL_ENVS},
           CHECKPOINT_KEY_ENV: "the-checkpoint-key-7890", "AWS_ACCESS_KEY_ID": "AKIA-store-key-5678",
           "AWS_SECRET_ACCESS_KEY": "store-secret-9012", "AWS_SESSION_TOKEN": "store-session-3456"}
SERVE = """
import sys
from rlkube.entrypoints.orchestrator import serve_main
sys.exit(serve_main("orchestrator", "tests.envs.program_serve", []))
"""
KEPT = """
from rlkube.withheld import withhold
from rlkube.auth import run_token
import fsspec, fsspec.config
withhold()
fs = fsspec.filesystem("s3", skip_instance_cache=True)
print(run_token(), fsspec.config.conf["s3"], fs.key, fs.secret, fs.token)
"""


def _python(code: str, tmp_path) -> str:
    """`code` in a new Python process with the secrets in its environment, as a pod has them.
    Without CAP_SYS_PTRACE, as in a pod (every capability dropped), when run as root here."""
    env = os.environ | SECRETS | {"HOME": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        argv = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", *argv]
    done = subprocess.run(argv, check=False, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_program_an_environment_runs_sees_no_secret(tmp_path):
    seen = _python(SERVE, tmp_path)
    own, parent = seen.split("--- parent")
    assert "PATH=" in own and "HOME=" in own  # harmless settings still reach it
    assert not [v for v in SECRETS.values() if v in own], own
    # The serving process is not dumpable: its original environment is closed to its children.
    assert "Permission denied" in parent and not [v for v in SECRETS.values() if v in parent], parent


def test_the_serving_process_keeps_them_for_itself(tmp_path):
    token, *store = _python(KEPT, tmp_path).split(" ", 1)
    assert token == SECRETS[TOKEN_ENV]
    for name, option in STORE_CREDENTIALS.items():
        assert f"'{option}': '{SECRETS[name]}'" in store[0]
    assert store[0].rstrip().endswith(" ".join(SECRETS[n] for n in STORE_CREDENTIALS))
