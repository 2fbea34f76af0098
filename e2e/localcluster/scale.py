"""The scale subresource of a CRD that declares one (`subresources.scale`): the `autoscaling/v1`
Scale that kube-apiserver serves at `.../<plural>/<name>/scale` over the object's
`specReplicasPath`, `statusReplicasPath` and `labelSelectorPath`. What `kubectl scale`, an HPA
or KEDA read and write; a write changes only the spec's replicas field, through the object's
own admission (its CEL rules), and bumps its generation like any spec change.
"""

import copy


def _keys(path: str) -> list[str]:
    """`.spec.inference.replicas` → its keys."""
    return path.lstrip(".").split(".")


def _get(obj: dict, path: str | None):
    for key in _keys(path) if path else ():
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj if path else None


def scale_of(obj: dict, paths: dict) -> dict:
    """The Scale of `obj` (a custom resource) under its CRD's `scale` paths."""
    meta = obj["metadata"]
    status = {"replicas": _get(obj, paths.get("statusReplicasPath")) or 0}
    if (selector := _get(obj, paths.get("labelSelectorPath"))) is not None:
        status["selector"] = selector
    return {
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                     if k in meta},
        "spec": {"replicas": _get(obj, paths["specReplicasPath"]) or 0},
        "status": status,
    }


def with_replicas(obj: dict, paths: dict, scale: dict) -> dict:
    """`obj` with the replicas of the written `scale` at its spec path; the Scale's
    resourceVersion, when it names one, is the write's precondition."""
    replicas = (scale.get("spec") or {}).get("replicas")
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise ValueError(f"spec.replicas: Invalid value: {replicas!r}: must be a non-negative integer")
    new = copy.deepcopy(obj)
    *parents, leaf = _keys(paths["specReplicasPath"])
    node = new
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = replicas
    if rv := (scale.get("metadata") or {}).get("resourceVersion"):
        new["metadata"]["resourceVersion"] = rv
    return new
