"""Small async functions the orchestrator (and eval, tests, benchmarks) use to drive one
`rlkube inference` server. Every call has a timeout and raises `InferenceError` naming the
server, the route and what went wrong.

The policy update of one replica is `pause` -> `update_weights` -> `resume`. Every call but
`/health` sends the run's credential its route needs (`rlkube.auth.route_headers`).
"""

import asyncio
import time
from typing import Literal

import httpx

from rlkube import auth
from rlkube.http import async_client
from rlkube.scopes import ADMIN, GENERATE

PauseMode = Literal["keep", "wait", "abort"]
NCCL_VERSION_POLL_S = 0.2
ADAPTER_ROUTE = "/rlkube/load_lora_adapter"
"""rlkube's route that loads a LoRA adapter in place (`rlkube.inference.lora_serving`)."""
UNLOAD_ROUTE = "/rlkube/unload_lora_adapter"
"""rlkube's route that removes a LoRA adapter from the engine, freeing its slot."""


class InferenceError(RuntimeError):
    """A call to an inference server failed or timed out."""


class ReplicaUnreachable(InferenceError):
    """The server did not answer at all (refused, reset, timed out): it is down or restarting,
    as opposed to answering with an error."""


def _reason(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body))
    return str(body.get("error", body) if isinstance(body, dict) else body)[:500]


async def post(base_url: str, route: str, timeout: float, headers: dict[str, str] | None = None,
               **kwargs) -> httpx.Response:
    """POST `route` with the credential it needs (`auth.route_headers`), or `headers` where
    given (a server outside the run gets its own credential or none)."""
    url = base_url.rstrip("/") + route
    try:
        async with async_client(timeout) as client:
            response = await client.post(url, headers=auth.route_headers(route) if headers is None else headers,
                                         **kwargs)
    except httpx.TimeoutException:
        raise ReplicaUnreachable(f"POST {url} timed out after {timeout:g}s") from None
    except httpx.TransportError as e:
        raise ReplicaUnreachable(f"POST {url} failed: {e!r}") from None
    except httpx.HTTPError as e:
        raise InferenceError(f"POST {url} failed: {e!r}") from None
    if response.status_code != 200:
        raise InferenceError(f"POST {url} returned {response.status_code}: {_reason(response)}")
    return response


async def _get(base_url: str, route: str, timeout: float, headers: dict[str, str] | None = None, **kwargs) -> dict:
    url = base_url.rstrip("/") + route
    try:
        async with async_client(timeout) as client:
            response = await client.get(url, headers=auth.route_headers(route) if headers is None else headers, **kwargs)
    except httpx.TransportError as e:
        raise ReplicaUnreachable(f"GET {url} failed: {e!r}") from None
    except httpx.HTTPError as e:
        raise InferenceError(f"GET {url} failed: {e!r}") from None
    if response.status_code != 200:
        raise InferenceError(f"GET {url} returned {response.status_code}: {_reason(response)}")
    return response.json()


async def is_healthy(base_url: str, timeout: float = 5) -> bool:
    try:
        async with async_client(timeout) as client:
            return (await client.get(base_url.rstrip("/") + "/health")).status_code == 200
    except httpx.HTTPError:
        return False


async def wait_until_healthy(base_url: str, timeout: float, interval: float = 1.0) -> None:
    """Return once `/health` answers 200; `InferenceError` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await is_healthy(base_url):
        if time.monotonic() > deadline:
            raise InferenceError(f"{base_url} did not become healthy within {timeout:g}s")
        await asyncio.sleep(interval)


async def pause(base_url: str, mode: PauseMode = "keep", timeout: float = 60) -> None:
    """Stop scheduling. `keep` freezes in-flight requests (they continue after `resume`, on the
    new weights); `wait` lets them finish first; `abort` cancels them."""
    await post(base_url, "/pause", timeout, params={"mode": mode})


async def resume(base_url: str, timeout: float = 60) -> None:
    await post(base_url, "/resume", timeout)


async def is_paused(base_url: str, timeout: float = 10) -> bool:
    return bool((await _get(base_url, "/is_paused", timeout))["is_paused"])


async def update_weights(base_url: str, step: int, location: str, timeout: float = 600, as_adapter: bool = False,
                         adapter_name: str | None = None) -> str:
    """Load policy `step` from `location` (a storage path/URL of a snapshot, or
    "grpc://host:port") on every worker of the server, then drop the KV prefix cache (it was
    computed with the old weights) and tag new tokens with weight version `step`.
    Returns the server's summary line.

    `as_adapter`: the snapshot is a LoRA run's adapter, loaded with vLLM's LoRA support as the
    model `rlkube-policy` (a server started with `inference.max_lora_rank`,
    `rlkube.inference.lora_serving`); otherwise the worker extension loads it (an adapter is
    merged into the base weights); `adapter_name`: under that model name instead (a pool
    member's), without tagging the server's weight version.

    An `nccl://` location means the trainer broadcasts the weights into the workers itself,
    pausing and resuming the server around it (`weights.type = "nccl"`); this then only waits,
    up to `timeout`, until the server serves version `step` or a newer one (the trainer may
    already have pushed the next). Do not pause around it: a resume could land in the middle of
    the trainer's next broadcast."""
    if location.startswith("nccl://"):
        deadline = time.monotonic() + timeout
        while not _is_at_least(version := await weight_version(base_url, timeout), step):
            if time.monotonic() > deadline:
                raise InferenceError(f"{base_url} serves weight version {version} after {timeout:g}s, expected {step}")
            await asyncio.sleep(NCCL_VERSION_POLL_S)
        return f"step {step} broadcast over NCCL (serving {version})"
    # The server gets `timeout` to obtain the snapshot, waiting for it included. vLLM's own RPC
    # deadline is only a backstop, with room for the load itself: it must not fire first, as
    # vLLM 0.32 then hands the worker's late answer to the next RPC (a later /pause fails).
    load_timeout = 2 * timeout
    arguments = {"location": location, "step": str(step), "timeout": str(timeout)}
    try:
        if as_adapter:
            named = arguments | ({"name": adapter_name} if adapter_name else {})
            response = await post(base_url, ADAPTER_ROUTE, load_timeout + 10, params=named)
            summary = response.json()["result"]
        else:
            rpc = {"method": "rlkube_load_weights", "kwargs": arguments, "timeout": load_timeout}
            response = await post(base_url, "/collective_rpc", load_timeout + 10, json=rpc)
            summary = response.json()["results"][0]
    except InferenceError as e:
        raise type(e)(f"loading weights of step {step} from {location}: {e}") from None
    await post(  # `name`: which member asks (rlkube.inference.member_auth); vLLM ignores it
        base_url, "/reset_prefix_cache", timeout,
        params={"reset_running_requests": "true"} | ({"name": adapter_name} if adapter_name else {}),
    )
    if adapter_name is None:  # a pool's members are at steps of their own: the server's one version is none of them
        await post(base_url, "/update_weight_version", timeout, json={"new_version": str(step)})
    return summary


async def adapter_step(base_url: str, name: str, timeout: float = 10) -> int | None:
    """The step of the LoRA adapter the server serves under model name `name` (None: not
    loaded), read with either credential a pool member holds (rlkube.inference.member_auth)."""
    headers = auth.http_headers(ADMIN) or auth.http_headers(GENERATE)
    return (await _get(base_url, ADAPTER_ROUTE, timeout, headers=headers, params={"name": name}))["step"]


async def unload_adapter(base_url: str, name: str, timeout: float = 30) -> str:
    """Remove the LoRA adapter named `name` from the server (a pool member that left): its
    `max_loras` slot is free, and requests naming it are refused. Loaded or not, it is gone
    after; returns the server's summary line."""
    return (await post(base_url, UNLOAD_ROUTE, timeout, params={"name": name})).json()["result"]


def _is_at_least(version: str | None, step: int) -> bool:
    return version is not None and version.isdigit() and int(version) >= step


async def weight_version(base_url: str, timeout: float = 10) -> str | None:
    """The weight version last set by `update_weights` ("default" before any update)."""
    return (await _get(base_url, "/weight_info", timeout))["weight_version"]


async def set_weight_version(base_url: str, step: int, timeout: float = 60) -> None:
    """Tag the weights served as policy `step` (what `weight_version` reads back)."""
    await post(base_url, "/update_weight_version", timeout, json={"new_version": str(step)})


async def load_base_weights(base_url: str, model: str, timeout: float = 600) -> None:
    """Reload the served model's own weights (policy 0) from `model`, its directory or hub id,
    and drop the prefix cache computed with the weights it replaces."""
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": model}, "timeout": timeout}
    try:
        await post(base_url, "/collective_rpc", timeout + 10, json=rpc)
    except InferenceError as e:
        raise InferenceError(f"reloading the base weights from {model}: {e}") from None
    await post(base_url, "/reset_prefix_cache", timeout, params={"reset_running_requests": "true"})
