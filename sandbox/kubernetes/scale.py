"""The `/scale` subresource (`autoscaling/v1` Scale) of the kinds that have one.

Deployments have it built in (`deployments.scale`). A custom resource has it when its
CRD declares `subresources.scale` with the paths of its replicas and selector, as Slinky's
NodeSet does (`specReplicasPath: .spec.replicas`, `statusReplicasPath: .status.replicas`,
`labelSelectorPath: .status.selector`; github SlinkyProject/slurm-operator,
`config/crd/bases/slinky.slurm.net_nodesets.yaml`, kept in
`sandbox/kubernetes/slinky_crds/`): the API server reads and writes those paths, and
`kubectl scale` finds the subresource through discovery.
"""

from __future__ import annotations

import copy
from typing import Any

from autoclusters.sandbox.kubernetes import deployments
from autoclusters.sandbox.kubernetes.crd_schema import schema_for
from autoclusters.sandbox.kubernetes.objects import DEPLOYMENTS, Kind, Obj


def paths(kind: Kind) -> dict[str, str] | None:
    """A custom kind's scale paths (specReplicasPath, ...); None when it has no scale."""
    if not kind.custom:
        return None
    published = schema_for(kind)
    return dict(published.scale) if published is not None and published.scale else None


def has_scale(kind: Kind) -> bool:
    return kind is DEPLOYMENTS or paths(kind) is not None


def _get(obj: Obj, path: str) -> Any:
    cur: Any = obj
    for key in path.lstrip(".").split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur


def _set(obj: Obj, path: str, value: Any) -> None:
    keys = path.lstrip(".").split(".")
    cur = obj
    for key in keys[:-1]:
        cur = cur.setdefault(key, {})
    cur[keys[-1]] = value


def scale(kind: Kind, obj: Obj) -> Obj:
    """The object's Scale."""
    if kind is DEPLOYMENTS:
        return deployments.scale(obj)
    where = paths(kind) or {}
    meta = obj["metadata"]
    status: Obj = {"replicas": _get(obj, where.get("statusReplicasPath", "")) or 0}
    selector = (
        _get(obj, where.get("labelSelectorPath", "")) if "labelSelectorPath" in where else None
    )
    if selector:
        status["selector"] = selector
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": _get(obj, where["specReplicasPath"]) or 0},
        "status": status,
    }


def scaled(kind: Kind, obj: Obj, replicas: int) -> Obj:
    """The object with its replicas (where its Scale's spec.replicas lives) set."""
    new = copy.deepcopy(obj)
    if kind is DEPLOYMENTS:
        new["spec"]["replicas"] = replicas
    else:
        _set(new, (paths(kind) or {})["specReplicasPath"], replicas)
    return new
