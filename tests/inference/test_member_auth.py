"""A pool's inference takes a member's credential only for that member's own adapter
(rlkube.inference.member_auth behind rlkube.auth.RequireToken), with the pool's token set: the
request reaches vLLM's app (here a recording ASGI app) with its body intact, or is answered 401."""

import asyncio
import json

import pytest
from rlkube import auth
from rlkube.scopes import ADMIN, GENERATE, member_scoped, scoped

POOL_TOKEN = "the-pool-token"


class Recorder:
    """Records each request's body, and what the app hears after it (vLLM listens there for the
    client going away)."""

    def __init__(self):
        self.bodies, self.after_body = [], []

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.bodies.append(message.get("body", b""))
        self.after_body.append((await receive())["type"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


def call(middleware, path: str, credential: str, body: dict | None = None, query: str = "", method: str = "POST") -> int:
    data = json.dumps(body).encode() if body is not None else b""
    chunks = [data[:5], data[5:]]  # a body in two messages

    async def receive():
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    sent = []

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query.encode(),
             "headers": [(b"authorization", f"Bearer {credential}".encode())]}
    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"]


@pytest.fixture
def middleware(monkeypatch):
    monkeypatch.setenv("RLKUBE_TOKEN", POOL_TOKEN)
    app = Recorder()
    return auth.RequireToken(app), app


def test_a_members_credential_generates_only_with_its_own_adapter(middleware):
    guard, app = middleware
    a_generate = member_scoped(POOL_TOKEN, "ns.a", GENERATE)
    body = {"model": "ns.a", "token_ids": [1, 2, 3]}
    assert call(guard, "/inference/v1/generate", a_generate, body) == 200
    assert json.loads(app.bodies[-1]) == body, "the body reaches vLLM whole"
    assert app.after_body[-1] != "http.disconnect", "vLLM would cancel the request as its client's gone"
    assert call(guard, "/v1/chat/completions", a_generate, {"model": "ns.b", "messages": []}) == 401
    assert call(guard, "/v1/completions", a_generate, {"prompt": "no model named"}) == 401
    assert call(guard, "/v1/models", a_generate) == 401, "listing every member's adapter is the pool's"
    assert call(guard, "/inference/v1/generate", member_scoped(POOL_TOKEN, "ns.b", GENERATE), body) == 401


def test_a_members_admin_credential_loads_only_its_own_adapter_and_never_pauses(middleware):
    guard, _ = middleware
    a_admin, a_generate = member_scoped(POOL_TOKEN, "ns.a", ADMIN), member_scoped(POOL_TOKEN, "ns.a", GENERATE)
    assert call(guard, "/rlkube/load_lora_adapter", a_admin, query="location=/w&step=1&name=ns.a") == 200
    assert call(guard, "/reset_prefix_cache", a_admin, query="reset_running_requests=true&name=ns.a") == 200
    assert call(guard, "/rlkube/load_lora_adapter", a_admin, query="location=/w&step=1&name=ns.b") == 401
    assert call(guard, "/rlkube/load_lora_adapter", a_admin, query="location=/w&step=1") == 401
    assert call(guard, "/rlkube/load_lora_adapter", a_generate, query="location=/w&step=1&name=ns.a") == 401
    assert call(guard, "/pause", a_admin, query="name=ns.a") == 401
    # unloading its own adapter (it leaves the pool): its admin credential, its own name alone
    assert call(guard, "/rlkube/unload_lora_adapter", a_admin, query="name=ns.a") == 200
    assert call(guard, "/rlkube/unload_lora_adapter", a_admin, query="name=ns.b") == 401
    assert call(guard, "/rlkube/unload_lora_adapter", a_admin) == 401
    assert call(guard, "/rlkube/unload_lora_adapter", a_generate, query="name=ns.a") == 401
    # reading the step of its own adapter (its sync's version): with either credential, its own alone
    for credential in (a_admin, a_generate):
        assert call(guard, "/rlkube/load_lora_adapter", credential, query="name=ns.a", method="GET") == 200
        assert call(guard, "/rlkube/load_lora_adapter", credential, query="name=ns.b", method="GET") == 401
    assert call(guard, "/collective_rpc", a_admin, {"model": "ns.a"}) == 401
    # the pool's own admin credential does all of it
    assert call(guard, "/pause", scoped(POOL_TOKEN, ADMIN)) == 200
    assert call(guard, "/rlkube/unload_lora_adapter", scoped(POOL_TOKEN, ADMIN), query="name=ns.b") == 200
