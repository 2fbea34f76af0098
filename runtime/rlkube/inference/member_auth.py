"""A pool's inference: which requests a MEMBER's credential grants (rlkube.auth.RequireToken asks
here when a request's credential is none of the server's own scopes).

Member `m` holds `member_scoped(pool_token, m, generate|admin)` (rlkube.scopes). With either it
may generate (and tokenize) with the model `m`, its own adapter, and nothing else; with its
admin credential it may also load its adapter (`POST /rlkube/load_lora_adapter?name=m`; with either,
`GET` reads the step of the one loaded) and reset the
prefix cache after it (`/reset_prefix_cache?name=m`: its cached prefixes were computed with its
previous adapter, which an in-place load keeps the id of; the reset drops every member's), and
unload it (`POST /rlkube/unload_lora_adapter?name=m`; the pool trainer unloads a member that
left with the pool's own admin credential). Pausing the shared server, loading full weights or another member's
adapter, and listing the models take the pool's own admin credential. The server derives the
members' credentials from the pool's token (`RLKUBE_TOKEN` of the inference process).
"""

import json
from urllib.parse import parse_qs

from rlkube.inference.client import ADAPTER_ROUTE, UNLOAD_ROUTE
from rlkube.scopes import ADMIN, GENERATE, MEMBER_NAME, member_scoped

MODEL_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/inference/v1/generate", "/tokenize",
                          "/detokenize"})
"""Generation routes whose JSON body names the model (`model`)."""
MAX_BODY = 8 << 20
"""A generation request larger than this is refused to a member before it is parsed."""


async def member_request(scope, receive, presented: str | None, pool_token: str, authorized):
    """`(receive, member)` to pass the request on with (its body replayed), when `presented` is
    the credential of the member it names for a scope its route grants; else None.
    `authorized(presented, credential)`: rlkube.auth.is_authorized."""
    path = scope["path"]
    if path in (ADAPTER_ROUTE, UNLOAD_ROUTE, "/reset_prefix_cache"):
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode()).items()}
        member = query.get("name")
        scopes = (GENERATE, ADMIN) if path == ADAPTER_ROUTE and scope.get("method") == "GET" else (ADMIN,)
        return (receive, member) if member and _holds(presented, pool_token, member, scopes, authorized) else None
    if path not in MODEL_ROUTES:
        return None
    body = await _read_body(receive)
    if body is None:
        return None
    try:
        member = json.loads(body or b"{}").get("model")
    except (ValueError, AttributeError):
        return None
    if not isinstance(member, str) or not _holds(presented, pool_token, member, (GENERATE, ADMIN), authorized):
        return None
    return _replay(body, receive), member


def _holds(presented, pool_token: str, member: str, scopes, authorized) -> bool:
    return bool(MEMBER_NAME.fullmatch(member)) and any(
        authorized(presented, member_scoped(pool_token, member, s)) for s in scopes)


async def _read_body(receive) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > MAX_BODY:
            return None
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive):
    """The request's body as one message, then the client's own messages: vLLM listens on them
    for the client going away (and cancels the request then), so a made-up disconnect right
    after the body would cancel every request."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
