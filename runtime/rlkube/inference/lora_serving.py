"""ASGI middleware for vLLM's server: load a LoRA run's published adapter with vLLM's own LoRA
support, in place, under one name (`POLICY_ADAPTER`, or a pool member's).

With `inference.max_lora_rank` set, `rlkube inference` starts vLLM with `--enable-lora` and adds
this middleware. `POST /rlkube/load_lora_adapter?location=...&step=N&timeout=S[&name=M]` then:
1. obtains the adapter directory of policy `step` at `location` (a local path or an fsspec URL of
   a storage snapshot, or `grpc://host:port`), waiting up to `timeout` seconds for it, and
   copies its two files into a staging directory of this server (a pod's local disk);
2. loads it into the engine in place of the previous policy's adapter, on every worker, with
   the adapter's id kept (requests that name it pick the new weights up);
3. registers it under `name` (`POLICY_ADAPTER` when not given), which requests name from then
   on. Each name has its own adapter id (a pool's members, one each, `inference.max_loras` at
   most): loading one member's adapter leaves the others' as they are, and a batch that mixes
   them decodes each row with its own (tests/inference/test_pool_adapters.py).
`GET /rlkube/load_lora_adapter?name=M` answers `{"name": M, "step": N, "in_engine": bool}`: the
step of the adapter loaded under `M` (null before any or after its unload): a pool member's own
version, as the server's weight version is none of theirs; `in_engine`: whether the engine holds
its weights in one of its `max_loras` slots now.
`POST /rlkube/unload_lora_adapter?name=M` removes the adapter named `M` from the engine and from
the served models (a pool member that left: its slot is free for another, and requests naming
`M` are refused from then on). Only the adapter moves: megabytes per update, whatever the size of the base model, which the
engine keeps as it is.

Why not vLLM's `/v1/load_lora_adapter` with `load_inplace`: in vLLM 0.32 the request it stores
for the adapter keeps `load_inplace=True`, so every scheduler step that serves it reads the
adapter from disk again (checked: changing the file on disk changed the next outputs with no
load in between). The request registered here does not carry the flag. The caller pauses the
server around the call and resets the prefix cache after it (`rlkube.inference.client`): the
cache keys on the adapter's id, which an in-place load keeps.
"""

import asyncio
import atexit
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs

from rlkube.config.inference import POLICY_ADAPTER
from rlkube.inference.client import ADAPTER_ROUTE as ROUTE
from rlkube.inference.client import UNLOAD_ROUTE
from rlkube.inference.worker import GRPC_SCHEME
from rlkube.scopes import MEMBER_NAME
from rlkube.transport.weights_grpc import fetch_snapshot
from rlkube.transport.weights_snapshot import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from rlkube.transport.weights_storage import local_snapshot

logger = logging.getLogger(__name__)


def stage_adapter(location: str, step: int, timeout: float, staging: Path) -> Path:
    """Copy the adapter of policy `step` at `location` into `staging/step_N` (written whole
    under a temporary name first); returns that directory."""
    files = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
    target, partial = staging / f"step_{step}", staging / f"step_{step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    if location.startswith(GRPC_SCHEME):
        snapshot = fetch_snapshot(location.removeprefix(GRPC_SCHEME), step, timeout)
        if ADAPTER_CONFIG not in snapshot:
            raise ValueError(f"{location} step {step} is not a LoRA adapter (no {ADAPTER_CONFIG}): full weights "
                             "load through /collective_rpc, not as an adapter")
        for name in files:
            (partial / name).write_bytes(snapshot[name])
    else:
        with local_snapshot(location, timeout) as path:
            if not (Path(path) / ADAPTER_CONFIG).is_file():
                raise ValueError(f"{location} is not a LoRA adapter (no {ADAPTER_CONFIG}): full weights load "
                                 "through /collective_rpc, not as an adapter")
            for name in files:
                shutil.copyfile(Path(path) / name, partial / name)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


class LoadLoraAdapter:
    """Answers `/rlkube/load_lora_adapter` and `/rlkube/unload_lora_adapter`; passes everything
    else on to vLLM's app."""

    def __init__(self, app):
        self.app = app
        self.staging = Path(tempfile.mkdtemp(prefix="rlkube-lora-"))
        atexit.register(shutil.rmtree, self.staging, True)
        self.lock = asyncio.Lock()
        self.steps: dict[str, int] = {}
        """The step of the adapter loaded under each name."""

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("GET", "POST") or scope["path"] not in (ROUTE, UNLOAD_ROUTE):
            await self.app(scope, receive, send)
            return
        query = {key: values[0] for key, values in parse_qs(scope["query_string"].decode()).items()}
        if scope["path"] == UNLOAD_ROUTE:
            await self.answer_unload(scope, send, query.get("name", POLICY_ADAPTER))
            return
        if scope["method"] == "GET":
            name = query.get("name", POLICY_ADAPTER)
            state = scope["app"].state
            known = state.openai_serving_models.lora_requests.get(name)
            in_engine = known is not None and known.lora_int_id in await state.engine_client.list_loras()
            await _answer(send, 200, {"name": name, "step": self.steps.get(name), "in_engine": in_engine})
            return
        try:
            location, step, timeout = query["location"], int(query.get("step", "-1")), float(query.get("timeout", "600"))
            name = query.get("name", POLICY_ADAPTER)
            if not MEMBER_NAME.fullmatch(name):
                raise ValueError(f"name {name!r} is not a lower-case DNS-1123 name")
        except (KeyError, ValueError) as e:
            await _answer(send, 400, {"error": f"{ROUTE} needs location, step (int) and timeout (float): {e!r}"})
            return
        try:
            async with self.lock:
                summary = await self.load(scope["app"].state, location, step, timeout, name)
        except Exception as e:  # the caller gets the reason; the server lives on
            logger.exception("loading the LoRA adapter of step %s from %s failed", step, location)
            await _answer(send, 500, {"error": f"loading the LoRA adapter of step {step} from {location}: {e}"})
            return
        await _answer(send, 200, {"result": summary})

    async def answer_unload(self, scope, send, name: str) -> None:
        if scope["method"] != "POST":
            await _answer(send, 405, {"error": f"{UNLOAD_ROUTE} is POST"})
            return
        async with self.lock:
            models = scope["app"].state.openai_serving_models
            known = models.lora_requests.pop(name, None)
            if known is not None:
                await scope["app"].state.engine_client.remove_lora(known.lora_int_id)
            self.steps.pop(name, None)
            shutil.rmtree(self.staging / name, ignore_errors=True)
        logger.info("unloaded the LoRA adapter %s%s", name, "" if known else " (none was loaded)")
        await _answer(send, 200, {"result": f"adapter {name} unloaded" if known else f"no adapter {name} was loaded"})

    async def load(self, state, location: str, step: int, timeout: float, name: str) -> str:
        from vllm.lora.request import LoRARequest

        start = time.perf_counter()
        staging = self.staging / name
        path = await asyncio.to_thread(stage_adapter, location, step, timeout, staging)
        models = state.openai_serving_models
        known = models.lora_requests.get(name)
        adapter_id = known.lora_int_id if known else models.lora_id_counter.inc(1)
        await state.engine_client.add_lora(LoRARequest(name, adapter_id, str(path), load_inplace=True))
        models.lora_requests[name] = LoRARequest(name, adapter_id, str(path))
        self.steps[name] = step
        for old in staging.iterdir():
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        size = (path / ADAPTER_WEIGHTS).stat().st_size
        took = time.perf_counter() - start
        logger.info("loaded the LoRA adapter %s of step %d from %s in %.2fs (%d bytes)", name, step, location, took, size)
        return f"adapter {name} of step {step} from {location} in {took:.3f}s ({size} bytes)"


async def _answer(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})
