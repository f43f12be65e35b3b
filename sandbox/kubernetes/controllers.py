"""What a real cluster's other components do to the objects, in the emulator's terms.

The store (`sandbox.kubernetes.store`) calls these inside its writes, so the API never shows a
state a controller would already have fixed:

- the kubelet's pod status (Running, Ready unless its probe fails);
- the node lifecycle controller's NoSchedule taints (`node.kubernetes.io/unschedulable`,
  `not-ready`, `unreachable`) following `spec.unschedulable` and the Ready condition;
- the disruption controller's PodDisruptionBudget status and the eviction check built on it
  (a Ready pod needs `disruptionsAllowed > 0`; a not-Ready one, under the default
  `IfHealthyBudget` policy, needs the budget met without it);
- the Node a freshly booted machine's kubelet registers.
"""

from __future__ import annotations

import math
import random
from typing import Any

from autoclusters.sandbox.kubernetes.objects import ApiError, Obj, new_uid, now

TERMINAL = ("Succeeded", "Failed")
_LIFECYCLE_TAINTS = (
    "node.kubernetes.io/unschedulable",
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
)


def condition(obj: Obj, kind: str) -> Obj | None:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == kind), None)


def is_ready(obj: Obj) -> bool:
    c = condition(obj, "Ready")
    return c is not None and c.get("status") == "True"


def running_status(pod: Obj, *, ready: bool) -> Obj:
    """The status the kubelet reports for a pod it runs; transition times move on change only."""
    status = dict(pod.get("status") or {})
    stamp = now()
    status.update(phase="Running", hostIP="127.0.0.1")
    status.setdefault("startTime", stamp)
    status.setdefault("podIP", f"10.244.{random.randrange(256)}.{random.randrange(1, 255)}")
    conds = {c["type"]: c for c in status.get("conditions") or []}
    wanted = [("PodScheduled", True), ("Initialized", True), ("ContainersReady", ready),
              ("Ready", ready)]  # fmt: skip
    for ctype, value in wanted:
        text = "True" if value else "False"
        if conds.get(ctype, {}).get("status") != text:
            conds[ctype] = {"type": ctype, "status": text, "lastTransitionTime": stamp}
    status["conditions"] = list(conds.values())
    old = {c["name"]: c for c in status.get("containerStatuses") or []}
    status["containerStatuses"] = [
        {
            "name": c["name"],
            "image": c["image"],
            "imageID": "",
            "ready": ready,
            "restartCount": old.get(c["name"], {}).get("restartCount", 0),
            "started": True,
            "containerID": old.get(c["name"], {}).get("containerID") or f"emulated://{new_uid()}",
            "state": {"running": {"startedAt": status["startTime"]}},
        }
        for c in pod["spec"]["containers"]
    ]
    return status


def lifecycle_taints(node: Obj) -> None:
    """Keep the node lifecycle controller's taints in line with the node (in place)."""
    spec = node.setdefault("spec", {})
    current = spec.get("taints") or []
    if not isinstance(current, list):
        return  # left for validation to refuse
    keep = [t for t in current if not (isinstance(t, dict) and t.get("key") in _LIFECYCLE_TAINTS)]
    ready = condition(node, "Ready")
    want = []
    if spec.get("unschedulable") is True:
        want.append(_LIFECYCLE_TAINTS[0])
    if ready is not None and ready.get("status") == "False":
        want.append(_LIFECYCLE_TAINTS[1])
    elif ready is not None and ready.get("status") != "True":
        want.append(_LIFECYCLE_TAINTS[2])
    for key in want:
        was = next((t for t in current if isinstance(t, dict) and t.get("key") == key), None)
        added = (was or {}).get("timeAdded") or now()
        keep.append({"key": key, "effect": "NoSchedule", "timeAdded": added})
    if keep:
        spec["taints"] = keep
    else:
        spec.pop("taints", None)


def set_ready(node: Obj, *, ready: bool, reason: str, message: str = "") -> None:
    """The kubelet's Ready condition (in place); lastTransitionTime moves only on a change."""
    conds = node.setdefault("status", {}).setdefault("conditions", [])
    stamp = now()
    text = "True" if ready else "False"
    cur = next((c for c in conds if c.get("type") == "Ready"), None)
    if cur is None:
        cur = {"type": "Ready"}
        conds.append(cur)
    if cur.get("status") != text:
        cur["lastTransitionTime"] = stamp
    cur.update(status=text, reason=reason, message=message or reason, lastHeartbeatTime=stamp)


def _scaled(value: Any, total: int) -> int:
    """An IntOrString: an integer, or a percentage of `total` rounded up (as upstream)."""
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(int(value[:-1]) * total / 100)
    return int(value)


def pdb_status(pdb: Obj, pods: list[Obj], owner_replicas: int) -> Obj:
    """The budget's status over the non-terminal pods its selector matches."""
    spec = pdb.get("spec") or {}
    expected = max(len(pods), owner_replicas)
    healthy = sum(1 for p in pods if not p["metadata"].get("deletionTimestamp") and is_ready(p))
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = 0
    allowed = max(0, healthy - desired)
    gen = pdb["metadata"].get("generation", 1)
    return {
        "observedGeneration": gen,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": "True" if allowed else "False",
                "reason": "SufficientPods" if allowed else "InsufficientPods",
                "message": "",
                "observedGeneration": gen,
                "lastTransitionTime": pdb["metadata"]["creationTimestamp"],
            }
        ],
    }


def check_budget(pdb: Obj, status: Obj, pod: Obj) -> None:
    """Raise the API server's 429 when evicting `pod` would break the budget."""
    policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy", "IfHealthyBudget")
    if is_ready(pod):
        if status["disruptionsAllowed"] > 0:
            return
    elif policy == "AlwaysAllow" or status["currentHealthy"] >= status["desiredHealthy"]:
        return
    cause = (
        f"The disruption budget {pdb['metadata']['name']} needs {status['desiredHealthy']} "
        f"healthy pods and has {status['currentHealthy']} currently"
    )
    raise ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )


def machine(
    name: str,
    *,
    provider_id: str,
    boot_id: str,
    labels: dict[str, str],
    annotations: dict[str, str],
    ready: bool,
    taints: list[Obj] | None = None,
    gpus: int | None = None,
) -> Obj:
    """The Node a machine's kubelet registers when it first boots (with the taints of its
    `--register-with-taints`, and the GPUs its device plugin advertises: 8 unless told)."""
    pressure = [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
    ]
    stamp = now()
    gpu_count = "8" if gpus is None else str(gpus)
    resources = {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": gpu_count, "pods": "110"}
    base_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    node: Obj = {
        "metadata": {"name": name, "labels": {**base_labels, **labels}, "annotations": annotations},
        "spec": {
            **({"providerID": provider_id} if provider_id else {}),
            **({"taints": [dict(t) for t in taints]} if taints else {}),
        },
        "status": {
            "addresses": [
                {"type": "Hostname", "address": name},
                {"type": "InternalIP", "address": "127.0.0.1"},
            ],
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [
                {
                    "type": t,
                    "status": "False",
                    "reason": r,
                    "message": r,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
                for t, r in pressure
            ],  # fmt: skip
            "nodeInfo": {
                "machineID": new_uid().replace("-", ""),
                "systemUUID": new_uid(),
                "bootID": boot_id,
                "kernelVersion": "6.8.0-emulated",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kubeletVersion": "v1.33.0",
                "kubeProxyVersion": "v1.33.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }
    set_ready(node, ready=ready, reason="KubeletReady" if ready else "KubeletNotReady")
    return node
