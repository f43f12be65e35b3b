"""The default scheduler's filters, as far as the sandbox's workloads need them.

A pod with no `spec.nodeName` goes to a node that is Ready, not cordoned, whose labels match
the pod's `nodeSelector`, whose NoSchedule/NoExecute taints the pod tolerates, and whose
allocatable `nvidia.com/gpu` covers the pod's request on top of what the node's
non-terminated pods (terminating ones included: they still hold their GPUs) request, and
where no pod of the same namespace matches a required pod anti-affinity term of the pod's
(`topologyKey: kubernetes.io/hostname`, `matchLabels`: one per node, as a Slinky
NodeSet's slurmd pods are kept). Among
the nodes that fit, the one with the most GPUs free, then by name (LeastAllocated scoring,
made deterministic). No fit: the pod stays Pending with PodScheduled=False and the
scheduler's kind of message ("0/3 nodes are available: ..."), and a `FailedScheduling`
Warning Event on the pod each time that message changes (as kube-scheduler records one).
"""

from __future__ import annotations

import hashlib
from collections import Counter

from autoclusters.sandbox.kubernetes.controllers import TERMINAL, is_ready
from autoclusters.sandbox.kubernetes.objects import Obj, labels_match, now

GPU = "nvidia.com/gpu"
_HARD = ("NoSchedule", "NoExecute")


def gpu_request(pod: Obj) -> int:
    """The pod's GPU request: requests, else limits (an extended resource's request defaults
    to its limit)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("requests") or {}).get(GPU, (res.get("limits") or {}).get(GPU, 0))
        total += int(value or 0)
    return total


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if (
            op == "Equal"
            and t.get("key") == taint.get("key")
            and (t.get("value") or "") == (taint.get("value") or "")
        ):
            return True
    return False


def _untolerated(pod: Obj, node: Obj) -> Obj | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in _HARD and not tolerates(tolerations, taint):
            return taint
    return None


def gpus_free(node: Obj, pods: list[Obj]) -> int:
    allocatable = int(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0) or 0)
    used = sum(
        gpu_request(p)
        for p in pods
        if p["spec"].get("nodeName") == node["metadata"]["name"]
        and (p.get("status") or {}).get("phase") not in TERMINAL
    )
    return allocatable - used


def _repelled(pod: Obj, node: Obj, pods: list[Obj]) -> bool:
    """Does a non-terminated pod on `node` match one of the pod's required anti-affinity
    terms (per node: topologyKey kubernetes.io/hostname)?"""
    anti = ((pod.get("spec") or {}).get("affinity") or {}).get("podAntiAffinity") or {}
    terms = anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    here = [
        p for p in pods
        if p["spec"].get("nodeName") == node["metadata"]["name"]
        and p["metadata"].get("namespace") == pod["metadata"].get("namespace")
        and (p.get("status") or {}).get("phase") not in TERMINAL
    ]  # fmt: skip
    for term in terms:
        if term.get("topologyKey") != "kubernetes.io/hostname":
            continue  # zones and racks: not modelled (a node is its own topology here)
        want = (term.get("labelSelector") or {}).get("matchLabels") or {}
        reqs = [(k, "In", [v]) for k, v in want.items()]
        if any(labels_match(p["metadata"].get("labels") or {}, reqs) for p in here):
            return True
    return False


def why_not(pod: Obj, node: Obj, pods: list[Obj]) -> str | None:
    """None when `pod` fits `node`, else the scheduler's reason for that node."""
    spec = node.get("spec") or {}
    if not is_ready(node):
        return "node(s) were not ready"
    if spec.get("unschedulable"):
        return "node(s) were unschedulable"
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    labels = node["metadata"].get("labels") or {}
    if not labels_match(labels, [(k, "In", [v]) for k, v in selector.items()]):
        return "node(s) didn't match Pod's node affinity/selector"
    if _repelled(pod, node, pods):
        return "node(s) didn't match pod anti-affinity rules"
    taint = _untolerated(pod, node)
    if taint is not None:
        value = f": {taint['value']}" if taint.get("value") else ""
        return f"node(s) had untolerated taint {{{taint['key']}{value}}}"
    want = gpu_request(pod)
    if want and gpus_free(node, pods) < want:
        return f"Insufficient {GPU}"
    return None


def place(pod: Obj, nodes: list[Obj], pods: list[Obj]) -> tuple[str | None, str]:
    """(the node to bind to, "") or (None, the unschedulable message)."""
    fits, reasons = [], Counter[str]()
    for node in nodes:
        reason = why_not(pod, node, pods)
        if reason is None:
            fits.append(node)
        else:
            reasons[reason] += 1
    if fits:
        best = min(fits, key=lambda n: (-gpus_free(n, pods), n["metadata"]["name"]))
        return best["metadata"]["name"], ""
    detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    message = f"0/{len(nodes)} nodes are available" + (f": {detail}." if detail else ".")
    return None, message


def unschedulable(status: Obj, message: str) -> Obj:
    """The pod's status with PodScheduled=False (transition time kept while unchanged)."""
    out = dict(status)
    conds = [c for c in out.get("conditions") or [] if c.get("type") != "PodScheduled"]
    was: Obj = next((c for c in out.get("conditions") or [] if c.get("type") == "PodScheduled"), {})
    stamp = was.get("lastTransitionTime") if was.get("status") == "False" else None
    conds.append(
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
            "lastTransitionTime": stamp or now(),
        }
    )
    out["conditions"] = conds
    return out


def scheduled(status: Obj) -> Obj:
    out = dict(status)
    conds = [c for c in out.get("conditions") or [] if c.get("type") != "PodScheduled"]
    conds.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now()})
    out["conditions"] = conds
    return out


def unschedulable_message(status: Obj) -> str | None:
    """The message of the pod's PodScheduled=False condition, if it has one."""
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or "")
    return None


def failed_scheduling(pod: Obj, message: str) -> Obj:
    """kube-scheduler's Event for a pod it cannot place (its name: one per message)."""
    meta, stamp = pod["metadata"], now()
    digest = hashlib.sha256(message.encode()).hexdigest()[:12]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{meta['name']}.{digest}", "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta.get("uid", "")},
        "reason": "FailedScheduling",
        "message": message,
        "type": "Warning",
        "source": {"component": "default-scheduler"},
        "reportingComponent": "default-scheduler",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }  # fmt: skip
