"""The Deployment controller's part, in the emulator's terms (apps/v1, one ReplicaSet's worth).

The pods of a Deployment are owned by it directly (no ReplicaSet objects: nothing the
project reads needs them) and named as a ReplicaSet names them, `<deploy>-<hash>-<rand5>`,
with the `pod-template-hash` label. The controller keeps the non-terminating pods equal to
`spec.replicas`; a scale-down deletes (gracefully) in the ReplicaSet controller's order:
unscheduled, then not Ready, then the lowest `controller.kubernetes.io/pod-deletion-cost`,
then the newest. A changed template is not rolled out: new pods take it, old ones stay.
"""

from __future__ import annotations

import copy
import hashlib
import math
from datetime import datetime
from typing import Any

from autoclusters.sandbox.kubernetes.controllers import TERMINAL, is_ready
from autoclusters.sandbox.kubernetes.objects import Obj, now

POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
TEMPLATE_HASH = "pod-template-hash"
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # apimachinery's rand.SafeEncodeString alphabet


def defaults(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    spec.setdefault(
        "strategy",
        {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
    )
    pod_spec = (spec.get("template") or {}).get("spec")
    if isinstance(pod_spec, dict):
        pod_spec.setdefault("restartPolicy", "Always")
        pod_spec.setdefault("terminationGracePeriodSeconds", 30)
        pod_spec.setdefault("dnsPolicy", "ClusterFirst")
        pod_spec.setdefault("schedulerName", "default-scheduler")


def template_hash(deploy: Obj) -> str:
    raw = repr(sorted_json(deploy["spec"].get("template") or {})).encode()
    digest = hashlib.sha256(raw).digest()
    return "".join(_SAFE[b % len(_SAFE)] for b in digest[:10])


def sorted_json(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, sorted_json(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(sorted_json(v) for v in value)
    return value


def owned_by(pod: Obj, deploy: Obj) -> bool:
    return any(
        ref.get("kind") == "Deployment" and ref.get("uid") == deploy["metadata"]["uid"]
        for ref in pod["metadata"].get("ownerReferences") or []
    )


def new_pod(deploy: Obj) -> Obj:
    """A pod from the template, as the ReplicaSet controller creates it (generateName)."""
    meta, template = deploy["metadata"], copy.deepcopy(deploy["spec"]["template"])
    tmeta = template.get("metadata") or {}
    h = template_hash(deploy)
    return {
        "metadata": {
            "generateName": f"{meta['name']}-{h}-",
            "labels": {**(tmeta.get("labels") or {}), TEMPLATE_HASH: h},
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": template["spec"],
    }


def deletion_cost(pod: Obj) -> int:
    raw = (pod["metadata"].get("annotations") or {}).get(POD_DELETION_COST, "0")
    try:
        return int(raw)
    except ValueError:
        return 0


def removal_order(pods: list[Obj], born: dict[str, int]) -> list[Obj]:
    """Pods in the order a scale-down removes them (`born`: creation order by uid)."""

    def rank(p: Obj) -> tuple[int, int, int, float, int]:
        bound = 1 if p["spec"].get("nodeName") else 0
        ready = 1 if is_ready(p) else 0
        # Newest first: by creation time, then (within its second) by creation order.
        created = datetime.strptime(p["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        return (bound, ready, deletion_cost(p), -created.timestamp(),
                -born.get(p["metadata"]["uid"], 0))  # fmt: skip

    return sorted(pods, key=rank)


def active(pods: list[Obj]) -> list[Obj]:
    """The pods that count towards replicas: neither terminating nor finished."""
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in TERMINAL
    ]


def status(deploy: Obj, pods: list[Obj], old: Obj | None) -> Obj:
    live = active(pods)
    h = template_hash(deploy)
    ready = sum(1 for p in live if is_ready(p))
    replicas = int(deploy["spec"].get("replicas", 1))
    updated = sum(1 for p in live if (p["metadata"].get("labels") or {}).get(TEMPLATE_HASH) == h)
    max_unavailable = _max_unavailable(deploy, replicas)
    out: Obj = {
        "observedGeneration": deploy["metadata"].get("generation", 1),
        "replicas": len(live),
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    if replicas - ready > 0:
        out["unavailableReplicas"] = replicas - ready
    terminating = len(pods) - len(live)
    if terminating:
        out["terminatingReplicas"] = terminating
    available = ready >= replicas - max_unavailable
    out["conditions"] = [
        _condition(
            old,
            "Available",
            available,
            "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if available
            else "Deployment does not have minimum availability.",
        ),
        _condition(
            old,
            "Progressing",
            True,
            "NewReplicaSetAvailable" if ready >= replicas else "ReplicaSetUpdated",
            f'ReplicaSet "{deploy["metadata"]["name"]}-{h}" is progressing.',
        ),
    ]
    return {k: v for k, v in out.items() if v != 0 or k == "observedGeneration"}


def _max_unavailable(deploy: Obj, replicas: int) -> int:
    rolling = ((deploy["spec"].get("strategy") or {}).get("rollingUpdate")) or {}
    value = rolling.get("maxUnavailable", "25%")
    if isinstance(value, str) and value.endswith("%"):
        return math.floor(int(value[:-1]) * replicas / 100)
    return int(value)


def _condition(old: Obj | None, kind: str, ok: bool, reason: str, message: str) -> Obj:
    text = "True" if ok else "False"
    was: Obj = next((c for c in (old or {}).get("conditions") or [] if c.get("type") == kind), {})
    stamp = now()
    same = was.get("status") == text
    return {
        "type": kind,
        "status": text,
        "reason": reason,
        "message": message,
        "lastUpdateTime": was.get("lastUpdateTime", stamp) if same else stamp,
        "lastTransitionTime": was.get("lastTransitionTime", stamp) if same else stamp,
    }


def scale(deploy: Obj) -> Obj:
    """The `autoscaling/v1` Scale of a Deployment (the `/scale` subresource)."""
    meta = deploy["metadata"]
    selector = (deploy["spec"].get("selector") or {}).get("matchLabels") or {}
    st = deploy.get("status") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k]
            for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            if k in meta
        },
        "spec": {"replicas": deploy["spec"].get("replicas", 1)},
        "status": {
            "replicas": st.get("replicas", 0),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(selector.items())),
        },
    }
