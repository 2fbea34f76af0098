"""The local cluster's own client of its API server, over HTTP: the calls the controllers and
the kubelet make. Answers a caller can live with (a pod deleted meanwhile, a create that
already happened) are given as `ok` statuses and come back as None. The tests' helpers
(tests/cluster/conftest.py, tests/operator/cluster.py) are built on it too, through `request`:
any status comes back, for them to judge."""

import json

import aiohttp

from e2e.localcluster import resources


class ApiError(aiohttp.ClientError):
    """A refusal the caller did not expect: its status and the API server's Status body."""

    def __init__(self, method: str, path: str, status: int, body):
        super().__init__(f"{method} {path}: {status} {body}")


class Api:
    """`kinds`: those it can address (default: the built-in ones and the CRDs'; a live view of
    an API server's own where that serves more); `agent`: its User-Agent, by which a test tells
    its own requests from the operator's."""

    def __init__(self, url: str, kinds=None, agent: str | None = None):
        self.url = url.rstrip("/")
        self.kinds = [*resources.BUILTIN, *resources.crd_kinds()] if kinds is None else kinds
        self.headers = {"User-Agent": agent} if agent else None
        self.session: aiohttp.ClientSession | None = None

    def kind(self, api_version: str, kind: str) -> resources.Kind | None:
        group, _, version = api_version.rpartition("/")
        return next((k for k in self.kinds if (k.group, k.version, k.kind) == (group, version, kind)), None)

    def core(self, plural: str) -> resources.Kind:
        """A kind of the core group by its plural (`pods`, `configmaps`, ...)."""
        return next(k for k in self.kinds if (k.group, k.version, k.plural) == ("", "v1", plural))

    def _kind(self, obj_or_kind) -> resources.Kind:
        if isinstance(obj_or_kind, resources.Kind):
            return obj_or_kind
        return self.kind(obj_or_kind["apiVersion"], obj_or_kind["kind"])

    async def request(self, method: str, path: str, body=None, content_type: str = "application/json",
                      params: dict | None = None) -> tuple[int, dict | None]:
        """The answer's status and JSON body, whatever the status."""
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30), headers=self.headers)
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.url + path, data=data, params=params,
                                        headers={"Content-Type": content_type}) as r:
            return r.status, await r.json(content_type=None)

    async def _call(self, method: str, path: str, body=None, content_type: str = "application/json", ok=(),
                    params: dict | None = None):
        status, answer = await self.request(method, path, body, content_type, params)
        if status in ok:
            return None
        if status >= 300:
            raise ApiError(method, path, status, answer)
        return answer

    async def list(self, kind: resources.Kind) -> list[dict]:
        return (await self._call("GET", kind.url()))["items"] or []

    async def get(self, kind: resources.Kind, namespace: str | None, name: str) -> dict | None:
        return await self._call("GET", kind.url(namespace, name), ok=(404,))

    async def create(self, obj: dict) -> None:
        await self._call("POST", self._kind(obj).url(obj["metadata"].get("namespace")), obj, ok=(409,))

    async def patch(self, obj: dict, patch: dict, status: bool = False) -> None:
        meta = obj["metadata"]
        path = self._kind(obj).url(meta.get("namespace"), meta["name"]) + ("/status" if status else "")
        await self._call("PATCH", path, patch, "application/merge-patch+json", ok=(404,))

    async def delete(self, obj: dict, policy: str = "Background", grace_s: int | None = None) -> None:
        """Delete this very object (its uid a precondition); `grace_s` 0 is the kubelet's last word."""
        meta = obj["metadata"]
        options = {"propagationPolicy": policy, "preconditions": {"uid": meta["uid"]}}
        params = None if grace_s is None else {"gracePeriodSeconds": str(grace_s)}
        if grace_s is not None:
            options["gracePeriodSeconds"] = grace_s
        await self._call("DELETE", self._kind(obj).url(meta.get("namespace"), meta["name"]), options,
                         ok=(404, 409), params=params)

    async def close(self) -> None:
        if self.session:
            await self.session.close()
