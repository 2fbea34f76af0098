"""A pod's volumes as host directories, and each container's mounts of them.

Emulated: `configMap` and `secret` (every key, or `items` key -> path; written when the pod
starts, and a ConfigMap's keys rewritten in place when the ConfigMap changes, as the kubelet's
atomic writer does within its sync period: `refresh_configmaps`), `emptyDir` (a per-pod directory, also for `medium: Memory`),
`persistentVolumeClaim` (`<state_dir>/pvcs/<ns>/<claim>`, shared by every pod using the claim:
ReadWriteMany for every access mode; the claim object must exist), `hostPath`. A mount's
`subPath` and `readOnly` are honoured. Not emulated: projected, downwardAPI, CSI and ephemeral
volumes, `defaultMode`, size limits.

Ownership as a kubelet sets it: an emptyDir is world-writable (0777); with the pod's `fsGroup`,
every volume but a hostPath belongs to that group, group-writable, its directories setgid (so new
files stay in the group), a claim's existing files included (`fsGroupChangePolicy: Always`).
Without `fsGroup` a claim stays as its provisioner made it: root's, writable by root only.
"""

import base64
import os
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


def _configmap_data(configmap: dict) -> dict[str, bytes]:
    data = {k: v.encode() for k, v in (configmap.get("data") or {}).items()}
    return data | {k: base64.b64decode(v) for k, v in (configmap.get("binaryData") or {}).items()}


def refresh_configmaps(pod: dict, paths: dict[str, Path], configmaps: dict[tuple[str, str], dict]) -> None:
    """Rewrite the keys of the pod's ConfigMap volumes whose data changed (`configmaps`: (namespace,
    name) -> ConfigMap), each by a rename, so a process reading the file sees the old or the new
    text, never half of one. (The kubelet swaps a `..data` link; a `subPath` mount sees no update
    on a real node, here neither for a file mounted alone.)"""
    fs_group = (pod.get("spec", {}).get("securityContext") or {}).get("fsGroup")
    for vol in pod.get("spec", {}).get("volumes") or []:
        obj = configmaps.get((pod["metadata"]["namespace"], (vol.get("configMap") or {}).get("name")))
        if obj is None or vol["name"] not in paths:
            continue
        data = _configmap_data(obj)
        for item in vol["configMap"].get("items") or [{"key": k, "path": k} for k in data]:
            path = paths[vol["name"]] / item["path"]
            if item["key"] not in data or not path.exists() or path.read_bytes() == data[item["key"]]:
                continue
            staged = path.with_name(f"..{path.name}.new")
            staged.write_bytes(data[item["key"]])
            if fs_group is not None:
                give_group(staged, fs_group)
            os.replace(staged, path)


def give_group(root: Path, gid: int) -> None:
    """`root` and everything in it: group `gid`, group-writable, directories setgid."""
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        os.chown(path, -1, gid)
        mode = path.stat().st_mode
        path.chmod(mode | 0o2070 if path.is_dir() else mode | 0o060 | (0o010 if mode & 0o100 else 0))


async def prepare(pod: dict, pod_dir: Path, pvc_root: Path, get: Getter) -> dict[str, Path]:
    """Make every volume of the pod; returns volume name -> host path."""
    ns = pod["metadata"]["namespace"]
    fs_group = (pod.get("spec", {}).get("securityContext") or {}).get("fsGroup")
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
                data = _configmap_data(obj)
            _write_keys(target, data, ref.get("items"), what)
        elif "emptyDir" in vol:
            target.mkdir(parents=True, exist_ok=True)
            target.chmod(0o777)
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
        if fs_group is not None and "hostPath" not in vol:
            give_group(target, fs_group)
        paths[name] = target
    return paths


def mounts(container: dict, volumes: dict[str, Path]) -> list[dict]:
    """The container's mounts for launch.py: source (host path), target, read_only."""
    out = []
    for vm in container.get("volumeMounts") or []:
        if vm["name"] not in volumes:
            raise ConfigError(f"container {container['name']}: volumeMount {vm['name']!r} names no volume")
        root = volumes[vm["name"]]
        source = root / vm.get("subPath", "")
        # Kubernetes creates a missing subPath as directories with the mode of the volume's root
        # (group-writable under an fsGroup), so a pod of another uid in that group writes there
        for missing in reversed([p for p in (source, *source.parents) if p.is_relative_to(root) and not p.exists()]):
            missing.mkdir()
            missing.chmod(root.stat().st_mode & 0o7777)
        out.append({"source": str(source), "target": vm["mountPath"], "read_only": bool(vm.get("readOnly"))})
    return out


def under_another(target: str, mounts: list[dict]) -> bool:
    """Whether `target` lies inside another mount's target (launch.py creates it there)."""
    return any(
        m["target"] != target and Path(target).is_relative_to(m["target"]) for m in mounts
    )
