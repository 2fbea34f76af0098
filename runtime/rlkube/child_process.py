"""What every child process rlkube starts carries, whichever room starts it (the local
supervisor, the inference process wrapper, tests)."""

import ctypes
import signal

_prctl = ctypes.CDLL(None, use_errno=True).prctl
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """`preexec_fn` of a child: the kernel sends it SIGTERM when the thread that started it
    ends (Linux `PR_SET_PDEATHSIG`), so start children from a thread that outlives them. A
    parent killed with SIGKILL (the OOM killer, `kill -9`) cannot stop its children itself."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
