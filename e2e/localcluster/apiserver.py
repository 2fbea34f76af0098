"""The local cluster's API server: kmock's Kubernetes emulator, made to answer like
kube-apiserver for kopf, the official Python client and `kubectl` 1.32.

On top of kmock's object store and HTTP plumbing it does what the real server does and the
clients rely on:

- identity: names from `generateName`, uid, creationTimestamp, a cluster-wide resourceVersion
  (optimistic concurrency on PUT and on patches naming one), `generation` bumped when anything
  but metadata and status changes; objects in a namespace that does not exist are refused;
- the status subresource: writes to the object ignore `status`, writes to `/status` change
  only `status`; a write that changes nothing changes no resourceVersion and sends no event;
- patches: JSON patch, merge patch, and strategic merge patch (merge patch whose lists of
  named items merge by name; `$` directives other than `$patch: delete` are dropped);
- lists with `kind: XList`, label selectors (`=`, `!=`, `in`, `notin`, exists, `!`) and field
  selectors (`=`, `!=` on any dotted path: metadata.name, involvedObject.uid, ...);
- watches from a resourceVersion (replayed from a bounded history, `410 Expired` before it) or
  from now (every object ADDED first), with selectors and `timeoutSeconds`;
- deletion: a Pod on a node is deleted gracefully (`deletionTimestamp` = now + grace,
  `deletionGracePeriodSeconds` from the request, else the pod's
  `terminationGracePeriodSeconds`, else 30) and stays until deleted with a grace of 0 (the
  kubelet's last word); an object with finalizers stays until they are gone;
  `propagationPolicy` Foreground/Orphan adds the `foregroundDeletion`/`orphan` finalizer that
  the garbage collector (controllers.py) acts on; preconditions (uid, resourceVersion);
- admission (admission.py) on every write but to `/status`: the CRDs' CEL rules, transition
  rules (`oldSelf`) on updates, and the fields of built-in kinds that cannot change (a Job's
  template and selector, a StatefulSet's spec but replicas/template/..., a PVC's spec but its
  requests, a Service's clusterIP, an immutable ConfigMap's data); then the stored
  ValidatingAdmissionPolicies through their bindings (policies.py), a denial answered 403 (or
  the validation's reason) with kube-apiserver's message;
- a CRD's scale subresource (scale.py: GET, PUT, PATCH of its `autoscaling/v1` Scale, what
  `kubectl scale` sends);
- discovery, OpenAPI v3 and Table output (resources.py); `pods/<name>/log` from the kubelet's
  log files when `logs` is given: the container's current run, or with `previous=true` (`kubectl
  logs --previous`) the run before it;
- reactions declared with kmock's DSL (`server["fetch v1/configmaps"] << 403`) answer first,
  so in-process tests can inject failures.

Not emulated: protobuf (answered 415: kubectl's imperative generators such as
`kubectl create configmap` send it; `kubectl apply`/`create -f` send JSON), authentication and
authorization, admission webhooks, server-side apply,
schema types and stored defaults, `limit`/`continue` paging (everything fits one page),
namespace finalization (a deleted namespace's objects are collected by
the garbage collector).
"""

import asyncio
import base64
import collections
import contextlib
import copy
import datetime
import itertools
import json
import random
import re
import string
import uuid
from collections.abc import Callable
from pathlib import Path

import aiohttp.web
import jsonpatch
import jsonpointer
import kmock

from e2e.localcluster import admission, policies, resources, scale
from e2e.localcluster.resources import Kind

HISTORY = 2000  # watch events kept for watches that resume from a resourceVersion
NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{kind.plural}{"." + kind.group if kind.group else ""} "{name}" not found')


def now(offset_s: float = 0) -> str:
    t = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_path(path: str) -> dict | None:
    """`/api/v1/namespaces/ns/pods/name/status` → its parts; None for non-resource paths."""
    parts = path.strip("/").split("/")
    if parts[0] == "api" and len(parts) >= 2:
        group, rest = "", parts[1:]
    elif parts[0] == "apis" and len(parts) >= 2:
        group, rest = parts[1], parts[2:]
    else:
        return None
    version, rest = (rest[0], rest[1:]) if rest else (None, [])
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in ("status", "finalize"):
        namespace, rest = rest[1], rest[2:]
    rest += [None] * 3
    return {"group": group, "version": version, "namespace": namespace, "plural": rest[0],
            "name": rest[1], "subresource": "/".join(p for p in rest[2:] if p) or None}


# --- selectors and patches ---------------------------------------------------------------------

def _split(selector: str) -> list[str]:
    return [t.strip() for t in re.split(r",(?![^(]*\))", selector or "") if t.strip()]


def labels_match(selector: str, labels: dict) -> bool:
    for term in _split(selector):
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op, values = m[1], m[2], {v.strip() for v in m[3].split(",")}
            if (op == "in") != (key in labels and labels[key] in values):
                return False
        elif m := re.fullmatch(r"([\w./-]+)\s*(!=|==|=)\s*([\w./-]*)", term):
            if (m[2] == "!=") == (labels.get(m[1]) == m[3]):
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def fields_match(selector: str, obj: dict) -> bool:
    for term in _split(selector):
        m = re.fullmatch(r"([\w.]+)\s*(!=|==|=)\s*(.*)", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
        value = obj
        for key in m[1].split("."):
            value = value.get(key) if isinstance(value, dict) else None
        if (m[2] == "!=") == (str(value if value is not None else "") == m[3]):
            return False
    return True


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target, patch):
    """A merge patch whose lists of named items (containers, env, volumes, ports...) merge by
    `name`, as the strategic merge patch does for those lists."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        old = result.get(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(old, list) and _named(value) and _named(old):
            merged = {item["name"]: item for item in old}
            for item in value:
                if item.get("$patch") == "delete":
                    merged.pop(item["name"], None)
                else:
                    merged[item["name"]] = strategic_merge_patch(merged.get(item["name"]), item)
            result[key] = list(merged.values())
        else:
            result[key] = strategic_merge_patch(old, value)
    return result


def _named(items: list) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def apply_patch(obj: dict, patch, content_type: str) -> dict:
    try:
        if "json-patch" in content_type:
            return jsonpatch.apply_patch(obj, patch)
        if "strategic-merge-patch" in content_type:
            return strategic_merge_patch(obj, patch)
        if "merge-patch" in content_type:
            return merge_patch(obj, patch)
        if content_type.startswith("application/json"):  # lenient, for test helpers: what the body says
            return jsonpatch.apply_patch(obj, patch) if isinstance(patch, list) else merge_patch(obj, patch)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
        raise ApiError(422, "Invalid", f"the patch cannot be applied: {e}") from e
    raise ApiError(415, "UnsupportedMediaType", f"the local cluster does not take {content_type!r} patches")


# --- the server --------------------------------------------------------------------------------

class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator answering like kube-apiserver (see the module docstring).

    `crd_dir`: the CRDs to serve; `logs(namespace, pod, uid, container, run)`: where one run of
    a container logs (its restart count when it started), for `kubectl logs`."""

    crd_dir: Path = resources.CRD_DIR
    keep_requests = 2000
    logs: Callable[[str, str, str, str, int], Path] | None = None
    extra_kinds: tuple[Kind, ...] = ()  # served besides the built-in ones and the CRDs
    parse_requests = False  # keep kmock's parse of every request (its resource, action), for tests

    def __attrs_post_init__(self) -> None:
        # Not kmock's: it would register its own fallback answers, and these are ours.
        served = [*resources.BUILTIN, *self.extra_kinds, *resources.crd_kinds(self.crd_dir)]
        self.kinds = {(k.group, k.version, k.plural): k for k in served}
        for k in self.kinds.values():  # for kmock's DSL, which resolves `v1/pods` against these
            self.resources[k.url().strip("/").removeprefix("apis/").removeprefix("api/")] = kmock.ResourceInfo(
                kind=k.kind, namespaced=k.namespaced, subresources=set(k.subresources))
        self._rv = itertools.count(1)
        self.resource_version = 0
        self._history: collections.deque = collections.deque(maxlen=HISTORY)
        self._compacted = 0  # the newest resourceVersion no longer in the history
        self._watchers: list[tuple[Kind, asyncio.Queue]] = []
        self._write = asyncio.Lock()

    # --- the store ---------------------------------------------------------------------------
    @staticmethod
    def key(kind: Kind, namespace: str | None, name: str) -> tuple:
        return kmock.resource(kind.group, kind.version, kind.plural), namespace if kind.namespaced else None, name

    def read(self, kind: Kind, namespace: str | None, name: str) -> dict | None:
        key = self.key(kind, namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key].raw

    def read_all(self, kind: Kind, namespace: str | None = None) -> list[dict]:
        res = kmock.resource(kind.group, kind.version, kind.plural)
        out = [obj.raw for (r, ns, _), obj in self.objects.items()
               if r == res and not obj.deleted and (namespace is None or ns == namespace)]
        return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def _store(self, kind: Kind, obj: dict, event: str) -> dict:
        self.resource_version = next(self._rv)
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        key = self.key(kind, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if event == "DELETED":
            self.objects[key].delete()
        else:
            self.objects[key] = obj  # a fresh history: kmock would otherwise keep every version
        obj = copy.deepcopy(obj)
        if len(self._history) == self._history.maxlen:
            self._compacted = self._history[0][0]
        self._history.append((self.resource_version, kind, {"type": event, "object": obj}))
        for watched, queue in self._watchers:
            if watched is kind:
                queue.put_nowait({"type": event, "object": obj})
        return obj

    # --- HTTP ---------------------------------------------------------------------------------
    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's entry point, parsing the request our way: kmock's own parser fails on paths
        such as `/api/v1/namespaces` and guesses Kubernetes actions we decide ourselves."""
        request = None
        if self._payloads or self.parse_requests:  # kmock's DSL matches its own parse of the request
            with contextlib.suppress(ValueError):  # a path kmock cannot parse: no reaction for it
                request = await kmock.Request._parse(raw, id=len(self._requests))
        if request is None:
            body = await raw.read()
            try:
                data = json.loads(body) if body else None
            except ValueError:
                data = None
            request = kmock.Request(id=len(self._requests), raw_request=raw, url=raw.url, method=raw.method,
                                    params=dict(raw.query), headers=dict(raw.headers), cookies=dict(raw.cookies),
                                    data=data, body=body, text=body.decode(errors="replace"))
        self._requests.append(request)
        if len(self._requests) > self.keep_requests:  # kmock records every request; a cluster runs for long
            del self._requests[: -self.keep_requests // 2]
        if self._payloads:  # reactions a test declared with kmock's DSL come first
            with contextlib.suppress(NotImplementedError):  # none matched
                return await self._react(request)
        try:
            return await self._serve(request)
        except ApiError as e:
            return self._status(e)
        except (TypeError, AttributeError, KeyError, ValueError) as e:
            return self._status(ApiError(400, "BadRequest", f"malformed request: {e!r}"))

    async def _react(self, request) -> aiohttp.web.StreamResponse:
        """The answer of the first reaction declared with kmock's DSL that matches (none:
        NotImplementedError)."""
        return await kmock.RawHandler._handle(self, request)

    @staticmethod
    def _status(e: ApiError) -> aiohttp.web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": e.message, "reason": e.reason, "code": e.code}
        return aiohttp.web.json_response(body, status=e.code)

    async def _serve(self, request):
        path = request.url.path.rstrip("/") or "/"
        kinds = list(self.kinds.values())
        if path == "/version":
            return aiohttp.web.json_response({"major": "1", "minor": "32", "gitVersion": "v1.32.0-localcluster",
                                              "platform": "linux/amd64"})
        if path == "/openapi/v3":
            return aiohttp.web.json_response(resources.openapi_index(kinds))
        if path.startswith("/openapi/v3/"):
            doc = resources.openapi_document(kinds, path.removeprefix("/openapi/v3/"))
            if doc is None:
                raise ApiError(404, "NotFound", f"no OpenAPI document at {path}")
            return aiohttp.web.json_response(doc)
        if path == "/api":
            return aiohttp.web.json_response({"kind": "APIVersions", "versions": ["v1"]})
        if path == "/apis":
            return aiohttp.web.json_response(resources.api_group_list(kinds))
        parts = parse_path(path)
        if parts is None:
            raise ApiError(404, "NotFound", f"the server could not find {path}")
        if parts["version"] is None:
            group = resources.api_group(kinds, parts["group"])
            if group is None:
                raise ApiError(404, "NotFound", f"the server could not find {path}")
            return aiohttp.web.json_response(group)
        if parts["plural"] is None:
            listed = resources.resource_list(kinds, parts["group"], parts["version"])
            if not listed["resources"]:
                raise ApiError(404, "NotFound", f"the server could not find {path}")
            return aiohttp.web.json_response(listed)
        kind = self.kinds.get((parts["group"], parts["version"], parts["plural"]))
        if kind is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return await self._serve_resource(request, kind, parts)

    async def _serve_resource(self, request, kind: Kind, parts: dict):
        ns, name, sub = parts["namespace"], parts["name"], parts["subresource"]
        params, method = request.params, request.method.upper()
        if sub not in (None, *kind.subresources) and not (kind.kind == "Pod" and sub == "log"):
            raise ApiError(404, "NotFound", f"{kind.plural} has no subresource {sub!r}")
        table = "as=Table" in request.headers.get("Accept", "")
        if method == "GET" and params.get("watch") in ("true", "1"):
            return await self._watch(request, kind, ns, name, params, table)
        if method == "GET" and name is None:
            items = [o for o in self.read_all(kind, ns) if self._selected(o, params)]
            rv = str(self.resource_version)
            if table:
                return aiohttp.web.json_response(resources.table(kind, items, params.get("includeObject", ""), rv))
            return aiohttp.web.json_response({"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                                              "metadata": {"resourceVersion": rv}, "items": items})
        if method == "GET" and sub == "log":
            return self._log(kind, ns, name, params)
        if sub == "scale":
            return aiohttp.web.json_response(await self._scale(request, kind, ns, name, method))
        if method == "GET":
            obj = self.read(kind, ns, name) or _raise(not_found(kind, name))
            if table:
                return aiohttp.web.json_response(resources.table(kind, [obj], params.get("includeObject", ""),
                                                                 obj["metadata"]["resourceVersion"]))
            return aiohttp.web.json_response(obj)
        body = request.data
        if "protobuf" in request.headers.get("Content-Type", ""):  # clients then retry with JSON
            raise ApiError(415, "UnsupportedMediaType", "the local cluster speaks JSON only")
        if method == "POST" and name is None:
            return aiohttp.web.json_response(await self.create_object(kind, ns, body), status=201)
        if method == "PUT" and name:
            return aiohttp.web.json_response(await self.update_object(kind, ns, name, sub, lambda _: body))
        if method == "PATCH" and name:
            content_type = request.headers.get("Content-Type", "application/merge-patch+json")
            return aiohttp.web.json_response(
                await self.update_object(kind, ns, name, sub, lambda obj: apply_patch(obj, body, content_type)))
        if method == "DELETE" and name:
            options = dict(body) if isinstance(body, dict) else {}
            for key in ("gracePeriodSeconds", "propagationPolicy"):
                if key in params:
                    options[key] = int(params[key]) if key == "gracePeriodSeconds" else params[key]
            return aiohttp.web.json_response(await self.delete_object(kind, ns, name, options))
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {request.url.path}")

    async def _scale(self, request, kind: Kind, ns: str, name: str, method: str) -> dict:
        """GET, PUT or PATCH a custom resource's Scale (scale.py)."""
        if method == "GET":
            return scale.scale_of(self.read(kind, ns, name) or _raise(not_found(kind, name)), kind.scale)
        if method not in ("PUT", "PATCH"):
            raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {request.url.path}")
        content_type = request.headers.get("Content-Type", "application/merge-patch+json")

        def change(obj: dict) -> dict:
            current = scale.scale_of(obj, kind.scale)
            wanted = request.data if method == "PUT" else apply_patch(current, request.data, content_type)
            try:
                return scale.with_replicas(obj, kind.scale, wanted)
            except ValueError as e:
                raise ApiError(422, "Invalid", f'Scale.autoscaling "{name}" is invalid: {e}') from None

        return scale.scale_of(await self.update_object(kind, ns, name, None, change), kind.scale)

    def _selected(self, obj: dict, params) -> bool:
        return (labels_match(params.get("labelSelector", ""), obj["metadata"].get("labels") or {})
                and fields_match(params.get("fieldSelector", ""), obj))

    def log_file(self, pod: dict, container: str, previous: bool = False) -> Path | None:
        """The log of the container's current run, or of the run before it: runs are counted by
        the container's restartCount, so a restart, or a pod recreated under the same name (another
        uid), never reads its predecessor's. None: there is no such run."""
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        run = next((s.get("restartCount", 0) for s in statuses if s["name"] == container), 0) - previous
        if self.logs is None or run < 0:
            return None
        meta = pod["metadata"]
        return self.logs(meta["namespace"], meta["name"], meta["uid"], container, run)

    def _log(self, kind: Kind, ns: str, name: str, params):
        pod = self.read(kind, ns, name) or _raise(not_found(kind, name))
        container = params.get("container") or pod["spec"]["containers"][0]["name"]
        previous = params.get("previous") == "true"
        file = self.log_file(pod, container, previous)
        if file is None or not file.exists():
            message = (f'previous terminated container "{container}" in pod "{name}" not found' if previous
                       else f'container "{container}" in pod "{name}" has no logs')  # kube-apiserver's words
            raise ApiError(400, "BadRequest", message)
        lines = file.read_text(errors="replace").splitlines(keepends=True)
        tail = int(params.get("tailLines", len(lines)))
        return aiohttp.web.Response(text="".join(lines[len(lines) - tail:] if tail else []))

    async def _watch(self, request, kind: Kind, ns: str | None, name: str | None, params, table: bool):
        queue: asyncio.Queue = asyncio.Queue()
        since = params.get("resourceVersion", "")
        async with self._write:
            if since not in ("", "0") and int(since) < self._compacted:
                backlog = [{"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                         "code": 410, "reason": "Expired",
                                                         "message": f"too old resource version: {since}"}}]
            elif since not in ("", "0"):
                backlog = [e for rv, k, e in self._history if rv > int(since) and k is kind]
            else:
                backlog = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in self.read_all(kind, ns)]
            self._watchers.append((kind, queue))
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request._raw_request)
        try:
            async with asyncio.timeout(float(params["timeoutSeconds"]) if "timeoutSeconds" in params else None):
                for event in backlog:
                    await self._send(response, event, kind, ns, name, params, table)
                if backlog and backlog[0]["type"] == "ERROR":
                    return response
                while True:
                    await self._send(response, await queue.get(), kind, ns, name, params, table)
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._watchers.remove((kind, queue))
        return response

    async def _send(self, response, event: dict, kind: Kind, ns, name, params, table: bool) -> None:
        obj = event["object"]
        if event["type"] != "ERROR":
            meta = obj["metadata"]
            if (ns and meta.get("namespace") != ns) or (name and meta["name"] != name) or not self._selected(obj, params):
                return
            if table:
                obj = resources.table(kind, [obj], params.get("includeObject", ""), meta["resourceVersion"])
        await response.write(json.dumps({"type": event["type"], "object": obj}).encode() + b"\n")

    # --- verbs ---------------------------------------------------------------------------------
    async def create_object(self, kind: Kind, namespace: str | None, body: dict) -> dict:
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body must be an object")
        obj = copy.deepcopy(body)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            namespace = namespace or meta.get("namespace")
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace of the URL")
            if not namespace:
                raise ApiError(400, "BadRequest", f"a {kind.kind} needs a namespace")
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        if not NAME.match(meta.get("name") or ""):
            raise ApiError(422, "Invalid", f'{kind.kind} "{meta.get("name")}" is invalid: metadata.name: '
                                           "must be a lowercase RFC 1123 subdomain")
        async with self._write:
            ns_kind = self.kinds["", "v1", "namespaces"]
            if kind.namespaced and self.read(ns_kind, None, namespace) is None:
                raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found')
            if self.read(kind, namespace, meta["name"]) is not None:
                raise ApiError(409, "AlreadyExists", f'{kind.plural} "{meta["name"]}" already exists')
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"):
                meta.pop(key, None)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            if "status" in kind.subresources:
                obj["status"] = {"phase": "Pending"} if kind.kind == "Pod" else {}
            _admit(kind, obj)
            self._enforce_policies(kind, "CREATE", obj, None)
            return self._store(kind, _normalized(obj), "ADDED")

    async def update_object(self, kind: Kind, namespace: str | None, name: str, subresource: str | None,
                     change: Callable[[dict], dict]) -> dict:
        """Apply `change` (a patch, or a replacement) to the stored object; a resourceVersion in
        the result is a precondition."""
        async with self._write:
            old = self.read(kind, namespace, name) or _raise(not_found(kind, name))
            new = change(copy.deepcopy(old))
            if not isinstance(new, dict):
                raise ApiError(400, "BadRequest", "the object must be a JSON object")
            wanted_rv = new.setdefault("metadata", {}).get("resourceVersion")
            if wanted_rv and wanted_rv != old["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} "{name}": '
                                                "the object has been modified; please apply your changes to the "
                                                "latest version and try again")
            if subresource == "status":
                new = old | {"status": new.get("status")}
            elif "status" in kind.subresources:
                new["status"] = old.get("status")
            meta = new["metadata"]
            for key in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                        "deletionGracePeriodSeconds", "generation", "resourceVersion"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
                else:
                    meta.pop(key, None)
            new["apiVersion"], new["kind"] = kind.api_version, kind.kind
            new = _normalized(new)
            if new == old:
                return old
            if subresource != "status":
                _admit(kind, new, old)
                self._enforce_policies(kind, "UPDATE", new, old)
            if {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
                    {k: v for k, v in old.items() if k not in ("metadata", "status")}:
                meta["generation"] = old["metadata"].get("generation", 1) + 1
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                return self._store(kind, new, "DELETED")
            return self._store(kind, new, "MODIFIED")

    def _enforce_policies(self, kind: Kind, operation: str, obj: dict, old: dict | None) -> None:
        """The bound ValidatingAdmissionPolicies; the object as defaulted by its schema."""
        group = "admissionregistration.k8s.io"
        bindings = self.read_all(self.kinds[group, "v1", "validatingadmissionpolicybindings"])
        if not bindings:
            return
        namespace_labels = None
        if kind.namespaced:
            name = obj["metadata"]["namespace"]
            namespace = self.read(self.kinds["", "v1", "namespaces"], None, name) or {}
            namespace_labels = (namespace.get("metadata", {}).get("labels") or {}) | {policies.NAME_LABEL: name}
        seen = [admission.with_defaults(kind.schema, o) if kind.schema and o else o for o in (obj, old)]
        try:
            denied = policies.denials(
                self.read_all(self.kinds[group, "v1", "validatingadmissionpolicies"]), bindings, group=kind.group,
                version=kind.version, plural=kind.plural, operation=operation, obj=seen[0], old=seen[1],
                namespace_labels=namespace_labels)
        except policies.PolicyError as e:
            raise ApiError(500, "InternalError", f"admission policy evaluation failed: {e}") from e
        if denied:
            qualified = f"{kind.plural}.{kind.group}" if kind.group else kind.plural
            codes = {"Forbidden": 403, "Invalid": 422, "Unauthorized": 401, "RequestEntityTooLarge": 413}
            raise ApiError(codes.get(denied[0].reason, 403), denied[0].reason,
                           f'{qualified} "{obj["metadata"]["name"]}" is forbidden: ' + "; ".join(map(str, denied)))

    async def delete_object(self, kind: Kind, namespace: str | None, name: str, options: dict) -> dict:
        async with self._write:
            obj = copy.deepcopy(self.read(kind, namespace, name) or _raise(not_found(kind, name)))
            meta = obj["metadata"]
            for key, value in (options.get("preconditions") or {}).items():
                if value and meta.get(key) != value:
                    raise ApiError(409, "Conflict", f"Precondition failed: {key} in precondition: {value}, "
                                                    f"{key} in object meta: {meta.get(key)}")
            policy = options.get("propagationPolicy") or ("Orphan" if options.get("orphanDependents") else None)
            finalizers = list(meta.get("finalizers") or [])
            extra = {"Foreground": "foregroundDeletion", "Orphan": "orphan"}.get(policy)
            if extra and extra not in finalizers and not meta.get("deletionTimestamp"):
                finalizers.append(extra)
            grace = 0
            if kind.kind == "Pod":
                spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
                grace = options.get("gracePeriodSeconds")
                grace = spec.get("terminationGracePeriodSeconds", 30) if grace is None else int(grace)
                if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
                    grace = 0  # nothing runs it: nothing to wait for
                if meta.get("deletionGracePeriodSeconds") is not None:
                    grace = min(grace, meta["deletionGracePeriodSeconds"])
            if not grace and not finalizers:
                return self._store(kind, obj, "DELETED")
            if meta.get("deletionGracePeriodSeconds") != grace or meta.get("finalizers", []) != finalizers:
                meta.update(deletionTimestamp=now(grace), deletionGracePeriodSeconds=grace, finalizers=finalizers)
                return self._store(kind, obj, "MODIFIED")
            return obj


def _admit(kind: Kind, obj: dict, old: dict | None = None) -> None:
    """The CRDs' CEL rules (transition rules on an update), and the built-in kinds' immutable fields."""
    errors = admission.check(kind.schema, obj, old)
    if old is not None:
        errors += admission.immutable_violations(kind.kind, old, obj)
    if errors:
        qualified = f"{kind.kind}.{kind.group}" if kind.group else kind.kind
        raise ApiError(422, "Invalid", f'{qualified} "{obj["metadata"]["name"]}" is invalid: ' + "; ".join(errors))


def _normalized(obj: dict) -> dict:
    """What the real server stores: a Secret's `stringData` goes into `data`, base64-encoded."""
    if obj["kind"] == "Secret" and "stringData" in obj:
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in obj.pop("stringData").items()}
        obj["data"] = {**(obj.get("data") or {}), **encoded}
    return obj


def _raise(error: Exception):
    raise error
