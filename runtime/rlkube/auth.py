"""The run's credentials: what every pod-to-pod API of a run requires (`Authorization: Bearer <credential>`).

A run's processes control each other: the orchestrator swaps the policy in vLLM through
`/collective_rpc`, env workers hand back rewards, the trainer streams the model from
`Weights.Fetch`. Any process that reaches those ports could do the same, so each server
refuses a caller that does not present a credential of the run, and of the scope the route
needs (`rlkube.scopes`: generate, admin, weights, rollouts, work):
- vLLM (`rlkube inference`): `RequireToken`, an ASGI middleware in front of every route:
  `GENERATION_ROUTES` take generate (or admin), `WEIGHT_UPDATE_ROUTES` admin or weights,
  every other route (vLLM's admin routes, rlkube's `/rlkube/*`) admin alone; only `/health` (the probes) and
  `/metrics` (numbers for a scraper) are open. A server accepts only the scopes it holds: the
  teacher's and the judge's hold generate alone, so nothing reaches their other routes;
- gRPC: `server_interceptors`, which answers UNAUTHENTICATED before any handler runs: the
  orchestrator's Rollouts service takes rollouts, its EnvWorkers work, the trainer's Weights
  weights (`SERVICE_SCOPES`), each call checked against its own service's scope.
Clients send the credential a route needs with `route_headers()` / `http_headers(scope)` /
`grpc_metadata(scope)`; verifiers' clients get `http_headers(GENERATE)` as their configured
headers. Weights are fetched with the weights credential only from the run's own weight
servers (`check_weights_peer`).

Each credential comes from the environment, `RLKUBE_TOKEN_<SCOPE>` (`credential`): the
operator sets in each pod those its component holds (`rlkube.scopes.HELD`) from the run's
Secret `<run>-token`; `rlkube rl` derives them from a fresh run token per run. A process
given the run's token itself (`RLKUBE_TOKEN`, a server started by hand) derives every scope
from it. A server without any serves everyone and says so loudly (a standalone
`rlkube inference` on a workstation), but on a Kubernetes cluster it refuses to start
(`serve_open`). The processes that run environments take them out of their environment at
start (`rlkube.withheld`), so that the programs environments start never see them.
"""

import hmac
import json
import logging
import os
import secrets

import grpc

from rlkube.scopes import (
    ADMIN,
    GENERATE,
    ROLLOUTS,
    SCOPES,
    WEIGHTS,
    WEIGHTS_PEERS_ENV,
    WORK,
    scope_env,
    scoped,
)
from rlkube.withheld import TOKEN_ENV, held

logger = logging.getLogger(__name__)

METADATA_KEY = "authorization"
"""The header (HTTP) and metadata key (gRPC, lower case) that carries `Bearer <token>`."""
OPEN_ROUTES = frozenset({"/health", "/metrics"})
"""vLLM routes served without the token: the kubelet's probes carry none, and a metrics
scraper reads numbers only; the run's NetworkPolicy admits just a labelled scraper."""
GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/models", "/inference/v1/generate",
                               "/tokenize", "/detokenize"})
"""vLLM routes that generate (or tokenize) and change nothing: the generate scope. Matched
exactly, so `/v1/../pause` is not one of them."""
WEIGHT_UPDATE_ROUTES = frozenset({"/pause", "/resume", "/is_paused", "/get_world_size", "/init_weight_transfer_engine",
                                  "/start_weight_update", "/update_weights", "/finish_weight_update",
                                  "/shutdown_weight_transfer_engine",
                                  "/reset_prefix_cache", "/update_weight_version", "/weight_info"})
"""vLLM routes of a policy update, which the orchestrator drives (admin) or, with NCCL, the
trainer (weights, `rlkube.transport.weights_nccl`)."""


SERVICE_SCOPES = {"Rollouts": ROLLOUTS, "EnvWorkers": WORK, "Weights": WEIGHTS}
"""The scope each gRPC service of a run accepts (`server_interceptors`): the orchestrator's
batches take rollouts, its rollout work work, the trainer's weight stream weights."""
GRPC_PACKAGE = "rlkube.v1"
"""rlkube.proto's package: a call's method is `/rlkube.v1.<Service>/<Method>`."""


def run_token() -> str | None:
    """The run's token (`RLKUBE_TOKEN`, or what `withheld.withhold` kept of it), None when this
    process was given none (a pod gets only its scopes' credentials)."""
    return held(TOKEN_ENV)


def credential(scope: str) -> str | None:
    """This process's credential for `scope`: `RLKUBE_TOKEN_<SCOPE>`, else derived from the
    run's token, else None (the process does not hold that scope)."""
    if value := held(scope_env(scope)):
        return value
    token = run_token()
    return scoped(token, scope) if token else None


def held_scopes() -> dict[str, str]:
    """Credential by scope, of those this process holds."""
    return {scope: value for scope in SCOPES if (value := credential(scope))}


def route_scopes(path: str) -> tuple[str, ...]:
    """The scopes a vLLM route accepts (see the module docstring)."""
    if path in GENERATION_ROUTES:
        return (GENERATE, ADMIN)
    if path in WEIGHT_UPDATE_ROUTES:
        return (ADMIN, WEIGHTS)
    return (ADMIN,)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _bearer(token: str) -> str:
    return f"Bearer {token}"


def is_authorized(presented: str | None, token: str) -> bool:
    """Whether `presented` (the Authorization value) is `Bearer <token>`, in constant time."""
    return presented is not None and hmac.compare_digest(presented.encode(), _bearer(token).encode())


def http_headers(scope: str) -> dict[str, str]:
    value = credential(scope)
    return {"Authorization": _bearer(value)} if value else {}


def route_headers(route: str) -> dict[str, str]:
    """The headers for vLLM's `route`: the credential of the first scope it accepts that this
    process holds."""
    for scope in route_scopes(route):
        if value := credential(scope):
            return {"Authorization": _bearer(value)}
    return {}


def served_model_headers(section: str, served_by_run: bool, api_key_env: str | None) -> dict[str, str]:
    """What the calls to a teacher or judge (`orchestrator.<section>`) carry: the key in
    `api_key_env` for servers outside the run, the generate credential for the run's own
    (`served_by_run`), else nothing: the run's credentials never go to a URL a user set.
    ValueError naming the field when `api_key_env` is not set in this process."""
    if api_key_env:
        if not (key := held(api_key_env)):
            raise ValueError(f"orchestrator.{section}.api_key_env: {api_key_env} is not set in this process's "
                             "environment (on a cluster, add it to the orchestrator's and env workers' pod env)")
        return {"Authorization": _bearer(key)}
    return http_headers(GENERATE) if served_by_run else {}


def grpc_metadata(scope: str) -> tuple[tuple[str, str], ...]:
    value = credential(scope)
    return bearer_metadata(value) if value else ()


def bearer_metadata(value: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata presenting the credential `value`."""
    return ((METADATA_KEY, _bearer(value)),)


def check_weights_peer(address: str) -> None:
    """Refuse (PermissionError) to send the weights credential to `address` ("host:port")
    unless it is one of the run's weight servers (`WEIGHTS_PEERS_ENV`): a location handed to
    `rlkube_load_weights` could name any address, and whoever listens there would get the
    credential and choose the weights. Without the list (a standalone server), any address
    is one, except on a Kubernetes cluster, where the operator always sets it."""
    if credential(WEIGHTS) is None:
        return
    peers = [p.strip() for p in os.environ.get(WEIGHTS_PEERS_ENV, "").split(",") if p.strip()]
    if address in peers or (not peers and not os.environ.get(IN_CLUSTER_ENV)):
        return
    raise PermissionError(f"{address} is not one of the run's weight servers ({WEIGHTS_PEERS_ENV}: "
                          f"{', '.join(peers) or 'unset'}): rlkube sends the weights credential only to the run's own")


IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every container of a Kubernetes pod."""


def serve_open(server: str) -> None:
    """`server` has no token to require. On a Kubernetes cluster it refuses to start (anyone
    in the cluster who reaches its port could drive it: under the operator every pod has the
    token, so a pod without one is misconfigured); elsewhere (a standalone `rlkube inference`
    on a workstation) it serves everyone and says so loudly."""
    if os.environ.get(IN_CLUSTER_ENV):
        raise RuntimeError(f"{server} would serve WITHOUT a token on a Kubernetes cluster: set the run's "
                           "credentials (RLKUBE_TOKEN_<SCOPE>: the operator sets in every pod of a run those its "
                           "component holds) to require `Authorization: Bearer <credential>`")
    logger.warning(
        "%s serves WITHOUT a token: anyone who reaches its port can call it. Set %s, or the run's "
        "credentials (RLKUBE_TOKEN_<SCOPE>; the operator and `rlkube rl` always do), to require "
        "`Authorization: Bearer <credential>`.", server, TOKEN_ENV
    )


def _refusal(what: str, scopes: tuple[str, ...]) -> str:
    needed = " or ".join(f"Bearer <{scope_env(scope)}>" for scope in scopes)
    return f"{what} requires the run's {' or '.join(scopes)} credential ({METADATA_KEY}: {needed})"


# --- gRPC ---------------------------------------------------------------------------------
def _presented(details: grpc.HandlerCallDetails) -> str | None:
    return dict(details.invocation_metadata or ()).get(METADATA_KEY)


def _refusing_handler(abort):
    """A handler that aborts without reading the call's request: declared request-streaming,
    so grpcio reads no message (of up to the server's 1 GiB limit) before the refusal. The wire
    framing is the same for every kind, so any client reads the status as usual."""
    return grpc.stream_stream_rpc_method_handler(abort)


def _service(method: str) -> str:
    """The service of a call's method (`/rlkube.v1.EnvWorkers/Work` -> `EnvWorkers`)."""
    return method.lstrip("/").split("/", 1)[0].removeprefix(GRPC_PACKAGE + ".")


class _ServiceScopes:
    """Each call is checked against its own service's scope: `credentials` is service ->
    (scope, the credential it takes); a service without one is refused."""

    def __init__(self, credentials: dict[str, tuple[str, str | None]]):
        self.credentials = credentials

    def refusal(self, details: grpc.HandlerCallDetails) -> str | None:
        """Why the call is refused, None if it presents its service's credential."""
        scope, token = self.credentials.get(_service(details.method), (None, None))
        if token is not None and is_authorized(_presented(details), token):
            return None
        return _refusal(details.method, (scope,)) if scope else f"{details.method}: this server takes no credential for it"


class TokenInterceptor(_ServiceScopes, grpc.ServerInterceptor):
    """For a thread-pool `grpc.server`: calls without their service's credential end UNAUTHENTICATED."""

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or (refused := self.refusal(details)) is None:
            return handler

        def abort(requests, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)

        return _refusing_handler(abort)


class AioTokenInterceptor(_ServiceScopes, grpc.aio.ServerInterceptor):
    """For a `grpc.aio.server`: calls without their service's credential end UNAUTHENTICATED."""

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or (refused := self.refusal(details)) is None:
            return handler

        async def abort(requests, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, refused)

        return _refusing_handler(abort)


def server_interceptors(server: str, services: tuple[str, ...], aio: bool) -> list:
    """The interceptors a gRPC server named `server` that serves `services` needs: a call
    without the scope its service accepts (`SERVICE_SCOPES`) is refused; none when this process
    holds none of those scopes (`serve_open`)."""
    credentials = {service: (SERVICE_SCOPES[service], credential(SERVICE_SCOPES[service])) for service in services}
    if all(token is None for _, token in credentials.values()):
        serve_open(server)
        return []
    return [AioTokenInterceptor(credentials) if aio else TokenInterceptor(credentials)]


# --- HTTP (vLLM's ASGI app) ---------------------------------------------------------------
class RequireToken:
    """ASGI middleware for vLLM's server (`--middleware rlkube.auth.RequireToken`, added last
    so it runs first): every HTTP request but `OPEN_ROUTES` needs a credential of a scope its
    route accepts (`route_scopes`) and this server holds (401). Given the pool's token
    (`RLKUBE_TOKEN`), a pool's inference also takes a member's credential for that member's own
    adapter (`rlkube.inference.member_auth`)."""

    def __init__(self, app):
        self.app = app
        self.held = held_scopes()
        self.pool_token = run_token()
        if not self.held:
            serve_open("rlkube inference (vLLM's routes, /collective_rpc and /pause included)")

    async def __call__(self, scope, receive, send):
        if not self.held or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_ROUTES:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        presented = headers.get(METADATA_KEY.encode())
        presented = presented.decode("latin-1") if presented is not None else None
        accepted = route_scopes(scope["path"])
        if any(is_authorized(presented, self.held[s]) for s in accepted if s in self.held):
            await self.app(scope, receive, send)
            return
        if self.pool_token and scope["type"] == "http":
            from rlkube.inference.member_auth import member_request

            if granted := await member_request(scope, receive, presented, self.pool_token, is_authorized):
                await self.app(scope, granted[0], send)
                return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": _refusal(scope["path"], accepted)}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
