"""The run's credentials, one per scope, and which component holds which.

A run's token is not handed out whole: each caller gets a credential for what it does, so that
whatever reaches one of them (an environment's program, a compromised judge) holds no more
than that component's part. Each credential is HMAC-SHA256 of the scope's name keyed by the
run's token, so whoever has the token (the operator, from its key and the run's uid;
`rlkube rl`, which makes it) derives all of them, and none of them gives back the token or
another scope's credential.

- `generate`: the generation routes of the policy's, the teacher's and the judge's vLLM
  (`rlkube.auth.GENERATION_ROUTES`): the orchestrator and env workers (rollouts, scoring);
- `admin`: the policy's vLLM's other routes (pause, resume, load weights, load an adapter):
  the orchestrator alone;
- `weights`: the trainer's weight server (`Weights.Fetch`), and with NCCL the weight-update
  routes of the policy's vLLM (`rlkube.auth.WEIGHT_UPDATE_ROUTES`): the trainer and inference;
- `rollouts`: the orchestrator's `Rollouts` gRPC (batches to the trainer, its policy reports):
  the trainer;
- `work`: the orchestrator's `EnvWorkers` gRPC (groups to run, rollouts back): the env workers,
  which run environments' code and so must not reach `Rollouts` (a forged `ReportPolicy` would
  name the weights inference loads; `GetBatch` would take the trainer's batches).

This module imports nothing beyond the standard library: the operator derives the credentials
it writes into the run's Secret with it.
"""

import base64
import hashlib
import hmac
import os
import re
import sys

GENERATE, ADMIN, WEIGHTS, ROLLOUTS, WORK = "generate", "admin", "weights", "rollouts", "work"
SCOPES = (GENERATE, ADMIN, WEIGHTS, ROLLOUTS, WORK)

HELD = {
    "inference": (GENERATE, ADMIN, WEIGHTS),  # serves generate and admin; fetches and accepts weights
    "teacher": (GENERATE,),
    "judge": (GENERATE,),
    "orchestrator": (GENERATE, ADMIN, ROLLOUTS, WORK),  # serves rollouts and work
    "env-worker": (GENERATE, WORK),
    "trainer": (ROLLOUTS, WEIGHTS),
    "tool-service": (),  # the run's tool service (`spec.toolService`) answers its envs' calls, holds nothing
    "export": (),  # the operator's export Job (`spec.export`) reads checkpoints and calls no one
}
"""The scopes each component's processes hold: a server accepts only the scopes it holds."""
WEIGHTS_PEERS_ENV = "RLKUBE_WEIGHTS_PEERS"
"""The run's weight servers, `host:port` comma-separated (the trainer's Service on the cluster;
`weights.grpc_host:grpc_port` under `rlkube rl`): the only addresses inference sends the weights
credential to (`rlkube.auth.check_weights_peer`)."""


def scope_env(scope: str) -> str:
    """The environment variable that carries `scope`'s credential: `RLKUBE_TOKEN_<SCOPE>`."""
    return f"RLKUBE_TOKEN_{scope.upper()}"


def scoped(token: str, scope: str) -> str:
    """`scope`'s credential under the run's `token`: HMAC-SHA256, URL-safe base64 unpadded."""
    digest = hmac.new(token.encode(), f"rlkube/{scope}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


MEMBER_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
"""A pool member's name: its directory under the pool's `members/`, its adapter's model name on
the pool's inference (lower-case DNS-1123 characters: `<namespace>.<run>` on a cluster)."""

MEMBER_SCOPES = (GENERATE, ADMIN, ROLLOUTS, WORK)
"""The scopes of a pool's member run: generation with its own adapter and loading it (the
pool's inference), its batches (its orchestrator's gRPC, which the pool's trainer pulls), its
env workers' work (its orchestrator's too)."""


def member_scoped(pool_token: str, member: str, scope: str) -> str:
    """Member `member`'s credential for `scope` under the POOL's token: another member's
    credential, or the member's for another scope, is a different HMAC."""
    if scope not in MEMBER_SCOPES:
        raise ValueError(f"scope {scope!r}: a pool member holds only {', '.join(MEMBER_SCOPES)}")
    return scoped(pool_token, f"member/{member}/{scope}")


def member_env(pool_token: str, member: str, component: str) -> dict[str, str]:
    """The credentials a member's `component` (orchestrator, env-worker) is given, by variable:
    those it holds (`HELD`) of the member's scopes, under the same variable names as a solo run's."""
    return {scope_env(s): member_scoped(pool_token, member, s) for s in HELD[component] if s in MEMBER_SCOPES}


def component_env(token: str, component: str) -> dict[str, str]:
    """The credentials `component` is given (`HELD`), by variable."""
    return {scope_env(scope): scoped(token, scope) for scope in HELD[component]}


if __name__ == "__main__":  # `python -m rlkube.scopes admin`: a scope's credential under RLKUBE_TOKEN, for curl
    if len(sys.argv) != 2 or sys.argv[1] not in SCOPES or not os.environ.get("RLKUBE_TOKEN"):
        sys.exit(f"usage: RLKUBE_TOKEN=<the run's token> python -m rlkube.scopes {{{','.join(SCOPES)}}}")
    print(scoped(os.environ["RLKUBE_TOKEN"], sys.argv[1]))
