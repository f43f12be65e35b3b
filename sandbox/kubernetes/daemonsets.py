"""The DaemonSet controller's part, in the emulator's terms (apps/v1).

One pod per eligible Node: a Node whose labels match the template's `nodeSelector` and
whose NoSchedule/NoExecute taints the pod tolerates (with the tolerations the real
controller adds to every daemon pod: not-ready, unreachable, the pressures, unschedulable,
so a cordoned or NotReady Node keeps its pod). The pod is bound to its Node at creation
(`spec.nodeName`; the real controller pins it with a node affinity and lets the scheduler
bind, to the same effect), named `<ds>-<rand5>` with the `controller-revision-hash` and
`pod-template-generation` labels. A pod whose Node went or no longer matches is deleted;
a deleted pod (`kubectl delete pod`) is replaced at once. A changed template is not rolled
out: new pods take it, old ones stay (`updatedNumberScheduled` says which).
"""

from __future__ import annotations

import copy

from autoclusters.sandbox.kubernetes.controllers import TERMINAL, is_ready
from autoclusters.sandbox.kubernetes.deployments import template_hash
from autoclusters.sandbox.kubernetes.objects import Obj
from autoclusters.sandbox.kubernetes.scheduler import tolerates

REVISION_HASH = "controller-revision-hash"
TEMPLATE_GENERATION = "pod-template-generation"
# What the DaemonSet controller adds to every daemon pod (pkg/controller/daemon/util
# AddOrUpdateDaemonPodTolerations).
DAEMON_TOLERATIONS: list[Obj] = [
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
]
_HARD = ("NoSchedule", "NoExecute")


def defaults(obj: Obj) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault(
        "updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    )
    pod_spec = (spec.get("template") or {}).get("spec")
    if isinstance(pod_spec, dict):
        pod_spec.setdefault("restartPolicy", "Always")
        pod_spec.setdefault("terminationGracePeriodSeconds", 30)
        pod_spec.setdefault("dnsPolicy", "ClusterFirst")
        pod_spec.setdefault("schedulerName", "default-scheduler")


def owned_by(pod: Obj, ds: Obj) -> bool:
    return any(
        ref.get("kind") == "DaemonSet" and ref.get("uid") == ds["metadata"]["uid"]
        for ref in pod["metadata"].get("ownerReferences") or []
    )


def _tolerations(ds: Obj) -> list[Obj]:
    own = ((ds["spec"].get("template") or {}).get("spec") or {}).get("tolerations") or []
    return [*own, *DAEMON_TOLERATIONS]


def eligible(ds: Obj, node: Obj) -> bool:
    """The Node should run the daemon pod: its labels match the nodeSelector and every hard
    taint on it is tolerated."""
    selector = ((ds["spec"].get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    tolerations = _tolerations(ds)
    return all(
        tolerates(tolerations, t)
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") in _HARD
    )


def new_pod(ds: Obj, node: str) -> Obj:
    """The daemon pod for `node`, as the controller creates it (generateName `<ds>-`)."""
    meta, template = ds["metadata"], copy.deepcopy(ds["spec"]["template"])
    tmeta = template.get("metadata") or {}
    spec = template["spec"]
    spec["nodeName"] = node
    spec["tolerations"] = _tolerations(ds)
    return {
        "metadata": {
            "generateName": f"{meta['name']}-",
            "labels": {
                **(tmeta.get("labels") or {}),
                REVISION_HASH: template_hash(ds),
                TEMPLATE_GENERATION: str(meta.get("generation", 1)),
            },
            "annotations": dict(tmeta.get("annotations") or {}),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "DaemonSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def active(pods: list[Obj]) -> list[Obj]:
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in TERMINAL
    ]


def plan(ds: Obj, nodes: list[Obj], pods: list[Obj]) -> tuple[list[str], list[Obj]]:
    """(the Nodes that need a pod, the pods to delete): one live pod per eligible Node."""
    live = active(pods)
    wanted = {n["metadata"]["name"] for n in nodes if eligible(ds, n)}
    on: dict[str, list[Obj]] = {}
    for p in live:
        on.setdefault(str(p["spec"].get("nodeName") or ""), []).append(p)
    create = sorted(n for n in wanted if n not in on)
    delete = [p for node, ps in sorted(on.items()) if node not in wanted for p in ps]
    # More than one on a Node (never made here; a pod created by hand): the newest go.
    for node, ps in on.items():
        if node in wanted and len(ps) > 1:
            ps = sorted(ps, key=lambda p: p["metadata"].get("creationTimestamp", ""))
            delete += ps[1:]
    return create, delete


def empty_status() -> Obj:
    """A new DaemonSet's status: its four counts are not omitempty in the API's Go types."""
    return {
        "currentNumberScheduled": 0,
        "numberMisscheduled": 0,
        "desiredNumberScheduled": 0,
        "numberReady": 0,
    }


def status(ds: Obj, nodes: list[Obj], pods: list[Obj]) -> Obj:
    live = active(pods)
    wanted = {n["metadata"]["name"] for n in nodes if eligible(ds, n)}
    scheduled = {str(p["spec"].get("nodeName") or "") for p in live}
    h = template_hash(ds)
    ready = sum(1 for p in live if is_ready(p))
    updated = sum(1 for p in live if (p["metadata"].get("labels") or {}).get(REVISION_HASH) == h)
    out: Obj = {
        "currentNumberScheduled": len(scheduled & wanted),
        "numberMisscheduled": len(scheduled - wanted),
        "desiredNumberScheduled": len(wanted),
        "numberReady": ready,
        "observedGeneration": ds["metadata"].get("generation", 1),
        "updatedNumberScheduled": updated,
        "numberAvailable": ready,
    }
    if len(wanted) - ready > 0:
        out["numberUnavailable"] = len(wanted) - ready
    return out
