"""A container's environment and command line, resolved as the kubelet does.

Emulated: `envFrom` (configMapRef/secretRef, with `prefix`), then `env` in order (`value` with
`$(VAR)` expansion from the variables defined before it, `valueFrom.fieldRef` for the downward-API
fields below, `configMapKeyRef`/`secretKeyRef` with `optional`), then `$(VAR)` expansion of
`command` and `args` from the whole environment (`$$` escapes, unknown names stay as written).
Not emulated: `resourceFieldRef`, and the variables of `enableServiceLinks`.

The process's identity (`identity`): `runAsUser`/`runAsGroup` (the container's over the pod's;
the image's USER where unset, root when that is unset too, as for the venv stand-in; group root
without `runAsGroup` or a group in USER, as on a cluster), `fsGroup` and `supplementalGroups` as
supplementary groups, `runAsNonRoot` refused for root as the kubelet does, and from the
container's securityContext `allowPrivilegeEscalation: false` (no_new_privs), `capabilities.drop:
[ALL]` (an empty bounding set) and `readOnlyRootFilesystem`. Not emulated: seccomp profiles,
`capabilities.add`, `privileged`, SELinux and AppArmor options.
"""

import base64
import re
from collections.abc import Awaitable, Callable

# get(kind, namespace, name) -> the object or None; kind is "configmaps" or "secrets".
Getter = Callable[[str, str, str], Awaitable[dict | None]]

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]")


class ConfigError(Exception):
    """The pod cannot start yet (a missing ConfigMap, key or unsupported field); the kubelet
    reports it as CreateContainerConfigError and retries."""


def expand(text: str, env: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _REF.sub(one, text)


def field_ref(pod: dict, path: str) -> str:
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs", [])),
    }
    if path in simple:
        return simple[path] or ""
    m = _FIELD.fullmatch(path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ConfigError(f"fieldRef.fieldPath {path!r} is not supported by the local kubelet")


def _decoded(obj: dict, secret: bool) -> dict[str, str]:
    if not secret:
        return dict(obj.get("data") or {})
    data = {k: base64.b64decode(v).decode() for k, v in (obj.get("data") or {}).items()}
    return data | dict(obj.get("stringData") or {})


async def _source(get: Getter, ns: str, ref: dict, secret: bool) -> dict[str, str] | None:
    kind = "secrets" if secret else "configmaps"
    obj = await get(kind, ns, ref["name"])
    if obj is None:
        if ref.get("optional"):
            return None
        raise ConfigError(f"{kind[:-1]} {ns}/{ref['name']} not found")
    return _decoded(obj, secret)


async def container_env(pod: dict, container: dict, get: Getter) -> dict[str, str]:
    ns = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        secret = "secretRef" in source
        data = await _source(get, ns, source["secretRef" if secret else "configMapRef"], secret)
        prefix = source.get("prefix", "")
        env.update({prefix + k: v for k, v in (data or {}).items()})
    for var in container.get("env") or []:
        name, value_from = var["name"], var.get("valueFrom")
        if value_from is None:
            env[name] = expand(var.get("value", ""), env)
        elif "fieldRef" in value_from:
            env[name] = field_ref(pod, value_from["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in value_from or "secretKeyRef" in value_from:
            secret = "secretKeyRef" in value_from
            ref = value_from["secretKeyRef" if secret else "configMapKeyRef"]
            data = await _source(get, ns, ref, secret)
            if data is not None and ref["key"] in data:
                env[name] = data[ref["key"]]
            elif not ref.get("optional"):
                raise ConfigError(f"key {ref['key']!r} not found in {ref['name']} (env {name})")
        else:
            raise ConfigError(f"env {name}: valueFrom {sorted(value_from)} is not supported")
    return env


def command_line(container: dict, env: dict[str, str], entrypoint: list[str] = (),
                 cmd: list[str] = ()) -> list[str]:
    """What the container runs, expanded, as Kubernetes combines it with the image's ENTRYPOINT
    and CMD: `command` replaces the ENTRYPOINT (and drops the CMD), `args` replaces the CMD."""
    command, args = container.get("command"), container.get("args")
    argv = (command + (args or [])) if command else [*entrypoint, *(args if args else cmd)]
    if not argv:
        raise ConfigError(f"container {container['name']}: no command, and its image has no "
                          "ENTRYPOINT or CMD (the venv stand-in has neither)")
    return [expand(a, env) for a in argv]


def identity(pod: dict, container: dict, image_user: tuple[int, int | None] | None = None) -> dict:
    """Who the container's process is and what it may do, for launch.py (see the docstring).
    `image_user`: the image's USER as (uid, gid or None), if it sets one."""
    pod_ctx = pod.get("spec", {}).get("securityContext") or {}
    ctx = container.get("securityContext") or {}
    merged = pod_ctx | {k: v for k, v in ctx.items() if v is not None}
    if merged.get("runAsUser") is None and image_user is not None:
        merged = {"runAsUser": image_user[0], "runAsGroup": image_user[1]} | merged
    uid = merged.get("runAsUser") or 0
    if merged.get("runAsNonRoot") and uid == 0:
        raise ConfigError("container has runAsNonRoot and image will run as root "
                          f"(pod: {pod['metadata']['name']!r}, container: {container['name']})")
    gid = merged.get("runAsGroup") or 0  # a cluster's default too: group root
    groups = [g for g in [pod_ctx.get("fsGroup"), *(pod_ctx.get("supplementalGroups") or [])] if g is not None]
    return {
        "uid": uid, "gid": gid, "groups": sorted({gid, *groups}),
        "no_new_privs": ctx.get("allowPrivilegeEscalation") is False,
        "drop_all_capabilities": "ALL" in ((ctx.get("capabilities") or {}).get("drop") or []),
        "read_only_root": bool(ctx.get("readOnlyRootFilesystem")),
    }
