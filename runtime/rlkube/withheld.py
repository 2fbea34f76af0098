"""Secrets withheld from the programs an environment starts.

An environment's code may be written by the policy itself (a code environment runs what the
model wrote), and every program it starts inherits the process's environment: verifiers'
subprocess runtime copies all of it but names containing `API_KEY`, and so do tool servers
and a plain `subprocess.run`. The run's token there would let such a program load weights of
its choosing into inference; the store's credentials, overwrite checkpoints.

So the processes that run environments (the orchestrator and its env workers) call
`withhold()` before they load any: it moves the run's token (`TOKEN_ENV`), its scoped
credentials (`CREDENTIAL_ENVS`), the keys of judges and teachers outside the run that the
config names (`extra`), the checkpoint key (`CHECKPOINT_KEY_ENV`) and the
object store's credentials (`STORE_CREDENTIALS`, the variables the operator's
`storage.objectStore.secretName` provides) out of `os.environ` into this process's memory.
rlkube's own code reads the token with `held` (`auth.run_token`), and fsspec gets the
credentials as its S3 defaults (`fsspec.config.conf`), so checkpoints still reach the store.

The kernel keeps a process's original environment in `/proc/<pid>/environ`, readable by any
process of the same user; `withhold` therefore also marks the process non-dumpable, which
closes that file and the process's memory to its children. Python code that runs inside the
process (an environment's reward function) is the process's own and is not fenced from it.
"""

import ctypes
import os

from rlkube.scopes import SCOPES, scope_env

TOKEN_ENV = "RLKUBE_TOKEN"
"""The run's token (`rlkube.auth` reads it through `held`)."""
CREDENTIAL_ENVS = tuple(scope_env(scope) for scope in SCOPES)
"""The run's credentials, one per scope (`rlkube.scopes`)."""
CHECKPOINT_KEY_ENV = "RLKUBE_CHECKPOINT_KEY"
"""The run's checkpoint key (`rlkube.manifest`): the trainer's alone, withheld in case a
process that runs environments inherited it (`rlkube rl`'s children share its environment)."""

STORE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "key", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_SESSION_TOKEN": "token"}
"""The object store's credential variables and the fsspec S3 option each becomes. Other
variables (`AWS_ENDPOINT_URL`, `AWS_REGION`) are not secret and stay in the environment."""

_PR_SET_DUMPABLE = 4
_held: dict[str, str] = {}


def held(name: str) -> str | None:
    """`name` from the environment, or from what `withhold` took out of it."""
    return os.environ.get(name) or _held.get(name)


def withhold(extra: tuple[str, ...] = ()) -> None:
    """Move the run's secrets, and the variables named in `extra`, out of this process's
    environment (see the module docstring); a no-op for those it lacks. Idempotent."""
    for name in (TOKEN_ENV, *CREDENTIAL_ENVS, CHECKPOINT_KEY_ENV, *STORE_CREDENTIALS, *extra):
        if (value := os.environ.pop(name, None)) is not None:
            _held[name] = value
    if store := {option: _held[name] for name, option in STORE_CREDENTIALS.items() if name in _held}:
        import fsspec.config

        for protocol in ("s3", "s3a"):
            fsspec.config.conf.setdefault(protocol, {}).update(store)
    if _held and ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed: the run's secrets would stay "
                      "readable in /proc/<pid>/environ")
