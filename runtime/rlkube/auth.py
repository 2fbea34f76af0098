"""The run's token: what every pod-to-pod API of a run requires (`Authorization: Bearer <token>`).

A run's processes control each other: the orchestrator swaps the policy in vLLM through
`/collective_rpc`, env workers hand back rewards, the trainer streams the model from
`Weights.Fetch`. Any process that reaches those ports could do the same, so each server
refuses a caller that does not present the run's token:
- vLLM (`rlkube inference`): `RequireToken`, an ASGI middleware in front of every route,
  vLLM's admin routes and rlkube's `/rlkube/*` included; only `/health` (the probes) and
  `/metrics` (numbers for a scraper) are open;
- gRPC (the orchestrator's Rollouts and EnvWorkers services, the trainer's Weights):
  `server_interceptors`, which answers UNAUTHENTICATED before any handler runs.
Clients send it with `http_headers()` / `grpc_metadata()`; verifiers' clients get
`http_headers()` as their configured headers.

The token comes from one place, the `RLKUBE_TOKEN` environment variable (`run_token`): the
operator sets it in every pod from the run's Secret `<run>-token`; `rlkube rl` makes a fresh
one per run for its children. A server without it serves everyone and says so loudly (a
standalone `rlkube inference` on a workstation), but on a Kubernetes cluster it refuses to
start (`serve_open`). The processes that run environments take it out of their environment
at start (`rlkube.withheld`), so that the programs environments start never see it.
"""

import hmac
import json
import logging
import os
import secrets

import grpc

from rlkube.withheld import TOKEN_ENV, held

logger = logging.getLogger(__name__)

METADATA_KEY = "authorization"
"""The header (HTTP) and metadata key (gRPC, lower case) that carries `Bearer <token>`."""
OPEN_ROUTES = frozenset({"/health", "/metrics"})
"""vLLM routes served without the token: the kubelet's probes carry none, and a metrics
scraper reads numbers only; the run's NetworkPolicy admits just a labelled scraper."""


def run_token() -> str | None:
    """The run's token (`RLKUBE_TOKEN`, or what `withheld.withhold` kept of it), None when the
    run has none."""
    return held(TOKEN_ENV)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _bearer(token: str) -> str:
    return f"Bearer {token}"


def is_authorized(presented: str | None, token: str) -> bool:
    """Whether `presented` (the Authorization value) is `Bearer <token>`, in constant time."""
    return presented is not None and hmac.compare_digest(presented.encode(), _bearer(token).encode())


def http_headers() -> dict[str, str]:
    token = run_token()
    return {"Authorization": _bearer(token)} if token else {}


def grpc_metadata() -> tuple[tuple[str, str], ...]:
    token = run_token()
    return ((METADATA_KEY, _bearer(token)),) if token else ()


IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
"""Set by the kubelet in every container of a Kubernetes pod."""


def serve_open(server: str) -> None:
    """`server` has no token to require. On a Kubernetes cluster it refuses to start (anyone
    in the cluster who reaches its port could drive it: under the operator every pod has the
    token, so a pod without one is misconfigured); elsewhere (a standalone `rlkube inference`
    on a workstation) it serves everyone and says so loudly."""
    if os.environ.get(IN_CLUSTER_ENV):
        raise RuntimeError(f"{server} would serve WITHOUT a token on a Kubernetes cluster: set {TOKEN_ENV} "
                           "(the operator sets it in every pod of a run) to require `Authorization: Bearer <token>`")
    logger.warning(
        "%s serves WITHOUT a token: anyone who reaches its port can call it. Set %s (the operator "
        "and `rlkube rl` always do) to require `Authorization: Bearer <token>`.", server, TOKEN_ENV
    )


def _refusal(what: str) -> str:
    return f"{what} requires the run's token ({METADATA_KEY}: Bearer <{TOKEN_ENV}>)"


# --- gRPC ---------------------------------------------------------------------------------
def _presented(details: grpc.HandlerCallDetails) -> str | None:
    return dict(details.invocation_metadata or ()).get(METADATA_KEY)


def _refusing_handler(abort):
    """A handler that aborts without reading the call's request: declared request-streaming,
    so grpcio reads no message (of up to the server's 1 GiB limit) before the refusal. The wire
    framing is the same for every kind, so any client reads the status as usual."""
    return grpc.stream_stream_rpc_method_handler(abort)


class TokenInterceptor(grpc.ServerInterceptor):
    """For a thread-pool `grpc.server`: calls without the token end UNAUTHENTICATED."""

    def __init__(self, token: str):
        self.token = token

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None or is_authorized(_presented(details), self.token):
            return handler

        def abort(requests, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, _refusal(details.method))

        return _refusing_handler(abort)


class AioTokenInterceptor(grpc.aio.ServerInterceptor):
    """For a `grpc.aio.server`: calls without the token end UNAUTHENTICATED."""

    def __init__(self, token: str):
        self.token = token

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or is_authorized(_presented(details), self.token):
            return handler

        async def abort(requests, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, _refusal(details.method))

        return _refusing_handler(abort)


def server_interceptors(server: str, aio: bool) -> list:
    """The interceptors a gRPC server named `server` needs: none without a token (`serve_open`)."""
    token = run_token()
    if token is None:
        serve_open(server)
        return []
    return [AioTokenInterceptor(token) if aio else TokenInterceptor(token)]


# --- HTTP (vLLM's ASGI app) ---------------------------------------------------------------
class RequireToken:
    """ASGI middleware for vLLM's server (`--middleware rlkube.auth.RequireToken`, added last
    so it runs first): every HTTP request but `OPEN_ROUTES` needs the run's token (401)."""

    def __init__(self, app):
        self.app = app
        self.token = run_token()
        if self.token is None:
            serve_open("rlkube inference (vLLM's routes, /collective_rpc and /pause included)")

    async def __call__(self, scope, receive, send):
        if self.token is None or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_ROUTES:
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        presented = headers.get(METADATA_KEY.encode())
        if is_authorized(presented.decode("latin-1") if presented is not None else None, self.token):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = json.dumps({"error": _refusal(scope["path"])}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})
