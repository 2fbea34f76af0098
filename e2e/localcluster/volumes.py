"""A pod's volumes as host directories, and each container's mounts of them.

Emulated: `configMap` and `secret` (every key, or `items` key -> path; written once when the pod
starts, not refreshed), `emptyDir` (a per-pod directory, also for `medium: Memory`),
`persistentVolumeClaim` (`<state_dir>/pvcs/<ns>/<claim>`, shared by every pod using the claim:
ReadWriteMany for every access mode; the claim object must exist), `hostPath`. A mount's
`subPath` and `readOnly` are honoured. Not emulated: projected, downwardAPI, CSI and ephemeral
volumes, `defaultMode`, size limits.
"""

import base64
from pathlib import Path

from e2e.localcluster.podenv import ConfigError, Getter


def _write_keys(target: Path, data: dict[str, bytes], items: list[dict] | None, what: str) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for item in items if items is not None else [{"key": k, "path": k} for k in data]:
        if item["key"] not in data:
            raise ConfigError(f"{what}: key {item['key']!r} not found")
        path = target / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[item["key"]])


async def prepare(pod: dict, pod_dir: Path, pvc_root: Path, get: Getter) -> dict[str, Path]:
    """Make every volume of the pod; returns volume name -> host path."""
    ns = pod["metadata"]["namespace"]
    paths: dict[str, Path] = {}
    for vol in pod.get("spec", {}).get("volumes") or []:
        name, target = vol["name"], pod_dir / "volumes" / vol["name"]
        if "configMap" in vol or "secret" in vol:
            secret = "secret" in vol
            ref = vol["secret" if secret else "configMap"]
            obj_name = ref["secretName" if secret else "name"]
            what = f"volume {name}: {'secret' if secret else 'configmap'} {ns}/{obj_name}"
            obj = await get("secrets" if secret else "configmaps", ns, obj_name)
            if obj is None and not ref.get("optional"):
                raise ConfigError(f"{what} not found")
            obj = obj or {}
            if secret:
                data = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
                data |= {k: v.encode() for k, v in (obj.get("stringData") or {}).items()}
            else:
                data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
                data |= {k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()}
            _write_keys(target, data, ref.get("items"), what)
        elif "emptyDir" in vol:
            target.mkdir(parents=True, exist_ok=True)
        elif "persistentVolumeClaim" in vol:
            claim = vol["persistentVolumeClaim"]["claimName"]
            if await get("persistentvolumeclaims", ns, claim) is None:
                raise ConfigError(f"volume {name}: persistentvolumeclaim {ns}/{claim} not found")
            target = pvc_root / ns / claim
            target.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in vol:
            target = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") == "DirectoryOrCreate":
                target.mkdir(parents=True, exist_ok=True)
            elif not target.exists():
                raise ConfigError(f"volume {name}: hostPath {target} does not exist")
        else:
            kinds = sorted(set(vol) - {"name"})
            raise ConfigError(f"volume {name}: {kinds} volumes are not supported by the local kubelet")
        paths[name] = target
    return paths


def mounts(container: dict, volumes: dict[str, Path]) -> list[dict]:
    """The container's mounts for launch.py: source (host path), target, read_only."""
    out = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volumes:
            raise ConfigError(f"container {container['name']}: volumeMount {vm['name']!r} names no volume")
        source = volumes[vm["name"]] / vm.get("subPath", "")
        if not source.exists():  # Kubernetes creates a missing subPath as a directory
            source.mkdir(parents=True)
        out.append({"source": str(source), "target": vm["mountPath"], "read_only": bool(vm.get("readOnly"))})
    return out


def under_another(target: str, mounts: list[dict]) -> bool:
    """Whether `target` lies inside another mount's target (launch.py creates it there)."""
    return any(
        m["target"] != target and Path(target).is_relative_to(m["target"]) for m in mounts
    )
