"""The lean rollout path: verifiers' interception, called in-process instead of over HTTP.

On verifiers' full path every model call of a rollout crosses two local HTTP hops: the
harness posts to the env's interception server (an aiohttp server on loopback), whose handler
records the turn on the trace and calls the engine. When the harness itself runs in the
orchestrator's process (rlkube's chat harness, or any harness with `IN_PROCESS = True`), the
first hop is pure overhead: a client, a connection, request and response framing on both ends.

`InProcessInterception` is verifiers' `InterceptionServer` without its listener. A rollout
still registers its session under a secret and gets an endpoint (`inproc://...`); the harness
hands the request body to `post()`, which runs the server's own handler (`handle_request`:
limits and `@stop`s, request/response interceptors, the graph commit, the call record,
retry atomicity). Traces, token ids, logprobs and masks are therefore what the full path
records, by construction; tests/orchestrator/test_lean_rollouts.py checks it.

The engine side is `EngineClient`: verifiers' `TrainClient` (renderer, token-in/token-out
`/inference/v1/generate`, the same response parsing) over one aiohttp connection pool per
replica instead of the OpenAI SDK over httpx, whose pool walks every connection on every
request (docs/orchestrator.md). Since the engine's answers pass through rlkube's code here,
the lean path also records which weights sampled each rollout (`recording_served_versions`), so
a replica that restarted on the base model cannot slip stale rollouts into training.

Eligible environments: every agent plays an in-process harness and the taskset has no tool
servers (those reach the interception's `/state` route over HTTP). `serving(env, path)` picks
the path; programs, sandboxes and tools keep verifiers' full path.

verifiers internals relied on (pinned 0.4.0; the exactness tests fail if they move): the
interception server's `handle_request`/`_handler_for`/`clients`, and `Env._interception`,
`Env._shared_tools`, `Env._harnesses`, which `Env.serving()` fills.
"""

import asyncio
import contextlib
import contextvars
import itertools
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from weakref import WeakValueDictionary

import aiohttp
from pydantic_core import to_json
from verifiers.v1.clients import resolve_client
from verifiers.v1.clients.train import ElasticRendererPool, TrainClient
from verifiers.v1.configs.client import (
    BaseClientConfig,
    TrainClientConfig,
    resolve_api_key,
    resolve_headers,
)
from verifiers.v1.dialects import DIALECTS
from verifiers.v1.errors import ProviderError
from verifiers.v1.interception import InterceptionServer

RolloutPath = Literal["auto", "lean", "verifiers"]

SCHEME = "inproc"
_LIVE: "WeakValueDictionary[str, InProcessInterception]" = WeakValueDictionary()
_ids = itertools.count()
_served: contextvars.ContextVar["Served | None"] = contextvars.ContextVar("served", default=None)


@dataclass
class Served:
    """What the engine said sampled a rollout's tokens (vLLM's per-request `weight_versions`
    spans, the tags rlkube sets to policy steps)."""

    versions: list[str] = field(default_factory=list)
    """Every version seen, once each, in order."""
    calls: list[list[str]] = field(default_factory=list)
    """Per model call, in call order: the version of each completion token."""


@contextlib.contextmanager
def recording_served_versions() -> Iterator[Served]:
    """Collect what the engine says sampled the tokens of every model call made inside.
    Calls in tasks started inside count too: they inherit the context, and with it the record."""
    served = Served()
    token = _served.set(served)
    try:
        yield served
    finally:
        _served.reset(token)


def _record_served_versions(content: bytes) -> None:
    served = _served.get()
    if served is None or b'"weight_versions"' not in content:
        return
    for choice in json.loads(content).get("choices", ()):
        per_token = [""] * len(choice.get("token_ids") or ())
        for span in choice.get("weight_versions") or ():
            if span["version"] not in served.versions:
                served.versions.append(span["version"])
            per_token[span["start"]:span["end"]] = [span["version"]] * (span["end"] - span["start"])
        served.calls.append(per_token)


class _Request(dict):
    """The parts of an aiohttp request the interception handler reads (headers, path, body),
    plus the per-request dict it stores its retry bookkeeping in."""

    def __init__(self, path: str, secret: str, body: bytes):
        super().__init__()
        self.path, self._body, self._read_bytes = path, body, None
        self.headers = {"Authorization": f"Bearer {secret}"}

    async def read(self) -> bytes:
        return self._body


class InProcessInterception(InterceptionServer):
    """An interception server reached by function call (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.base_url = f"{SCHEME}://interception-{next(_ids)}"
        self._handlers = {route: self._handler_for(d) for d in DIALECTS for route in d.routes}
        self._client_of: dict[int, tuple[BaseClientConfig, Any]] = {}

    async def start(self) -> None:
        _LIVE[self.base_url] = self
        self.stack.callback(_LIVE.pop, self.base_url, None)

    def _client(self, config: BaseClientConfig):
        """One client per endpoint config, as verifiers' server keeps, found by identity first:
        the ModelContexts are built once per replica and their client config rides every
        rollout by reference, so the usual lookup (a JSON dump of the config per rollout) is
        only the fallback. Token-in/token-out configs get `EngineClient`."""
        hit = self._client_of.get(id(config))
        if hit is not None and hit[0] is config:
            return hit[1]
        key = config.model_dump_json()
        client = self.clients.get(key)
        if client is None:
            client = EngineClient(config) if isinstance(config, TrainClientConfig) else resolve_client(config)
            self.clients[key] = client
            self.stack.push_async_callback(client.close)
        self._client_of[id(config)] = (config, client)
        return client

    async def post(self, route: str, secret: str, body: Mapping) -> tuple[int, bytes]:
        """(HTTP status, response body) of `body` posted to `route` (`/v1/chat/completions`),
        served by the interception handler. It runs as its own task, as under aiohttp: the
        handler adopts the current task so that concluding the rollout cancels a straggler
        call, which must not cancel the rollout itself."""
        handler = self._handlers.get(route)
        if handler is None:
            return 404, to_json({"error": f"no route {route}"})
        response = await asyncio.ensure_future(handler(_Request(route, secret, to_json(body))))
        return response.status, response.body


def in_process_interception(endpoint: str) -> InProcessInterception | None:
    """The live in-process interception behind a rollout's model `endpoint` (`<base_url>/v1`),
    or None when the endpoint is a real server (the full path)."""
    if not endpoint.startswith(f"{SCHEME}://"):
        return None
    return _LIVE.get(endpoint.rstrip("/").removesuffix("/v1"))


ENGINE_LOST = ("engine unreachable", "engine timed out")
"""How `_EngineHTTP` words a model call that never got an answer from its replica."""


class _EngineHTTP:
    """The slice of `openai.AsyncOpenAI` that `renderers.client.generate` uses (`base_url`,
    `post` returning the raw response, `get` of JSON), over one aiohttp session. A non-2xx
    answer raises verifiers' `ProviderError` with its status, as the OpenAI SDK's error would
    after `TrainClient` translated it."""

    def __init__(self, config: TrainClientConfig):
        self.base_url = config.base_url.rstrip("/")
        # Configured headers win over the API key's, as in the OpenAI SDK (the run's token is one).
        self.headers = {"Authorization": f"Bearer {resolve_api_key(config)}", **resolve_headers(config)}
        timeout = config.timeout
        self.timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout.connect, sock_read=timeout.read)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:  # built on the event loop that uses it
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=aiohttp.TCPConnector(limit=0), json_serialize=_dumps
            )
        return self._session

    def _url(self, path: str) -> str:
        return path if "://" in path else self.base_url + "/" + path.lstrip("/")

    async def _request(self, method: str, path: str, body: Any = None, headers: Mapping | None = None) -> bytes:
        try:
            async with self.session.request(
                method, self._url(path), json=body, headers={**self.headers, **(headers or {})}
            ) as response:
                content = await response.read()
        except TimeoutError as e:
            raise ProviderError(f"{ENGINE_LOST[1]}: {e}", status_code=504) from e
        except aiohttp.ClientConnectionError as e:
            raise ProviderError(f"{ENGINE_LOST[0]}: {e}", status_code=503) from e
        except aiohttp.ClientError as e:
            raise ProviderError(f"{type(e).__name__}: {e}", status_code=502) from e
        if response.status >= 400:
            raise ProviderError(f"HTTP {response.status}: {content[-2000:].decode(errors='replace')}", status_code=response.status)
        return content

    async def post(self, path: str, *, cast_to: Any, body: Any, options: Mapping | None = None):
        content = await self._request("POST", path, body, (options or {}).get("headers"))
        _record_served_versions(content)
        return _Raw(content)

    async def get(self, path: str, *, cast_to: Any):
        return json.loads(await self._request("GET", path))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class _Raw:
    def __init__(self, content: bytes):
        self.content = content


def _dumps(obj: Any) -> str:
    return to_json(obj).decode()


class EngineClient(TrainClient):
    """verifiers' token-in/token-out `TrainClient` over `_EngineHTTP` (see the module docstring)."""

    def __init__(self, config: TrainClientConfig) -> None:
        # TrainClient's own __init__, without building the OpenAI SDK client it would replace.
        self.config = config
        self.client = _EngineHTTP(config)
        if config.renderer_model_name is not None:
            ElasticRendererPool(config.renderer_model_name, config.renderer, multiplex=config.multiplex).warm()


@contextlib.asynccontextmanager
async def serve_in_process(env) -> AsyncIterator[None]:
    """`env.serving()` with an `InProcessInterception` as the env's interception."""
    async with env.shared_tools() as shared, InProcessInterception() as interception:
        env._shared_tools, env._interception = shared, interception
        try:
            await env.start()
            yield
        finally:
            try:
                await env.stop()
            finally:
                env._shared_tools, env._interception = {}, None


def not_in_process(env) -> str | None:
    """Why `env` cannot take the lean path, or None when it can."""
    for name, harness in env._harnesses.items():
        if not getattr(harness, "IN_PROCESS", False):
            return f"agent '{name}' plays harness '{harness.config.id}', which does not run in-process"
    taskset = env.taskset
    if taskset.toolsets(taskset.config) or type(taskset).task_type().toolsets(taskset.config.task):
        return "its tasks use tool servers"
    return None


def resolve_path(env, path: RolloutPath = "auto", name: str = "env") -> Literal["lean", "verifiers"]:
    """The path `env` takes: lean where `path` allows it and the env can take it (`auto`), else
    verifiers'; `lean` on an env that cannot take it is an error naming why."""
    if path == "verifiers":
        return "verifiers"
    reason = not_in_process(env)
    if reason is not None and path == "lean":
        raise ValueError(f"env '{name}': rollout_path 'lean' needs in-process harnesses: {reason}")
    return "verifiers" if reason else "lean"


def serving(env, path: RolloutPath = "auto", name: str = "env"):
    """The context `env` serves rollouts in, on the path `resolve_path` picks."""
    return serve_in_process(env) if resolve_path(env, path, name) == "lean" else env.serving()
