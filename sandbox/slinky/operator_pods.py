"""The Kubernetes side of the emulated Slinky NodeSet controller, DaemonSet-like: which Nodes
a NodeSet runs on, and the slurmd pod it runs there.

Sources (github SlinkyProject/slurm-operator, HEAD f2ed3fc, 2026-08-20):
- the pod template's node selector is `spec.template.spec.nodeSelector` (`PodTemplate`,
  `api/v1beta1/base_types.go`); one pod per matching Node
  (`internal/controller/nodeset/nodeset_sync.go` `podsShouldBeOnNode`);
- the annotations `nodeset.slinky.slurm.net/pod-cordon` and `.../node-cordon-reason` and
  the label `.../pod-hostname` (the Slurm node's name): `api/v1beta1/well_known.go`.

The pod is `slurmd-<node>` with Slinky's labels and an ownerReference to its NodeSet:
what the product's code that finds a node's slurmd pod reads.

A NodeSet scaled beyond its Nodes gets a Pending pod per missing Node,
`slurmd-<nodeset>-new-<k>` (no Node, one slurmd per Node by a required pod anti-affinity,
as a StatefulSet-mode NodeSet's pods are kept apart), for the cluster autoscaler to see and
make a Node for (sandbox/slinky_autoscaler.py); the Node's own pod then takes its place.
"""

from __future__ import annotations

from typing import Any

GROUP, VERSION, NODESETS = "slinky.slurm.net", "v1beta1", "nodesets"
PREFIX = "nodeset.slinky.slurm.net/"
POD_CORDON = PREFIX + "pod-cordon"
NODE_CORDON_REASON = PREFIX + "node-cordon-reason"
# DaemonSet mode: the Slurm node name of the slurmd on a Node, when not the Node's name.
HOSTNAME_OVERRIDE = PREFIX + "hostname-override"
POD_HOSTNAME = PREFIX + "pod-hostname"
# Without a node selector, a NodeSet runs on every GPU node: what a sandbox machine's
# kubelet registers with (sandbox/machines/backend.py `_register_once`).
DEFAULT_SELECTOR = {"nvidia.com/gpu.present": "true"}
SLURMD_IMAGE = "ghcr.io/slinkyproject/slurmd:25.05"

Obj = dict[str, Any]


def pod_name(node: str) -> str:
    return f"slurmd-{node}"


def new_node_pod_name(nodeset: str, k: int) -> str:
    return f"slurmd-{nodeset}-new-{k}"


def node_selector(nodeset: Obj) -> dict[str, str]:
    template = (nodeset.get("spec") or {}).get("template") or {}
    selector = (template.get("spec") or {}).get("nodeSelector")
    return dict(selector) if selector else dict(DEFAULT_SELECTOR)


def eligible(node: Obj, selector: dict[str, str]) -> bool:
    labels = node["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


def replicas(nodeset: Obj) -> int | None:
    """The cap on the NodeSet's pods; None (no cap) when unset. The real operator ignores
    `replicas` in DaemonSet mode; here it caps the pods so a scale-in can be exercised."""
    value = (nodeset.get("spec") or {}).get("replicas")
    return None if value is None else max(int(value), 0)


def owned_by(pod: Obj, nodeset: Obj) -> bool:
    """Is the NodeSet the pod's controller? By uid: a NodeSet deleted and created again under
    the same name does not own its predecessor's pods."""
    uid = nodeset["metadata"].get("uid")
    return any(
        ref.get("kind") == "NodeSet" and ref.get("controller")
        and ref.get("name") == nodeset["metadata"]["name"] and (not uid or ref.get("uid") == uid)
        for ref in pod["metadata"].get("ownerReferences") or []
    )  # fmt: skip


def slurm_name(pod: Obj) -> str:
    """The Slurm node the pod's slurmd registers: its hostname (DaemonSet mode: the Node's)."""
    labels, spec = pod["metadata"].get("labels") or {}, pod.get("spec") or {}
    return str(labels.get(POD_HOSTNAME) or spec.get("hostname") or spec.get("nodeName") or "")


def cordoned(pod: Obj) -> bool:
    return (pod["metadata"].get("annotations") or {}).get(POD_CORDON) == "true"


def terminating(pod: Obj) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def node_of(pod: Obj) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def hostname_of(node: Obj) -> str:
    """The Slurm node a slurmd on `node` registers as: the Node's hostname-override
    annotation (Slinky's DaemonSet mode), else the Node's name."""
    notes = node["metadata"].get("annotations") or {}
    return str(notes.get(HOSTNAME_OVERRIDE) or node["metadata"]["name"])


def slurmd_pod(nodeset: Obj, node: str, hostname: str | None = None) -> Obj:
    """The NodeSet's slurmd pod for `node`, its Slurm node `hostname` (default: `node`)."""
    meta = nodeset["metadata"]
    hostname = hostname or node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(node),
            "namespace": meta["namespace"],
            "labels": {
                "app.kubernetes.io/name": "slurmd",
                "app.kubernetes.io/instance": meta["name"],
                POD_HOSTNAME: hostname,
            },
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "NodeSet",
                    "name": meta["name"],
                    "uid": meta.get("uid", ""),
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "hostname": hostname,
            "containers": [{"name": "slurmd", "image": SLURMD_IMAGE}],
        },
    }


def new_node_pod(nodeset: Obj, k: int) -> Obj:
    """The NodeSet's k-th Pending pod, waiting for a Node: its node selector, and kept off
    every Node that runs one of the NodeSet's slurmd pods (kubernetes.io/hostname)."""
    pod = slurmd_pod(nodeset, "")
    meta = nodeset["metadata"]
    pod["metadata"]["name"] = new_node_pod_name(meta["name"], k)
    del pod["metadata"]["labels"][POD_HOSTNAME]  # its Slurm node is its future Node's
    spec = pod["spec"]
    del spec["nodeName"], spec["hostname"]
    spec["nodeSelector"] = node_selector(nodeset)
    mine = {"app.kubernetes.io/name": "slurmd", "app.kubernetes.io/instance": meta["name"]}
    spec["affinity"] = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": mine}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    return pod


def waiting_for_node(pod: Obj) -> bool:
    """A Pending pod with no Node (one of `new_node_pod`'s)."""
    return not node_of(pod)
