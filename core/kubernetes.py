"""Kubernetes vocabulary: the marks AutoClusters leaves on a node and the step models.

Every mark says who made it and why, so a human reading `kubectl describe node` knows, and so
our undo touches only what we did:

- taint `autoclusters.io/remediation=<phase>:NoSchedule` (one, its value the runbook phase);
- label `autoclusters.io/phase=<phase>` (select quarantined nodes with `-l`);
- annotation `autoclusters.io/incident=<incident id>` (whose cordon it is);
- annotation `nodeset.slinky.slurm.net/node-cordon-reason=<reason>`: on Slinky, the
  slurm-operator drains the Slurm node when the K8s node is cordoned and uses this text as
  the drain reason (prefixed `slurm-operator:`);
- node condition `GpuUnhealthy` (True while the incident holds the node).

The helpers at the end read Nodes and Pods as the API's JSON in these terms (which machine is
behind a node, which pods a drain leaves alone, which pod is a Slinky slurmd).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, field_validator

TAINT_KEY = "autoclusters.io/remediation"
PHASE_LABEL = "autoclusters.io/phase"
INCIDENT_ANNOTATION = "autoclusters.io/incident"
CORDON_REASON_ANNOTATION = "nodeset.slinky.slurm.net/node-cordon-reason"
# What SchedMD's Slinky operator puts before every Slurm reason it writes, and so the mark of
# a reason it may change: its slurmd pod's preStop hook marks the node DOWN with
# "slurm-operator: Pod is terminating" (overwriting any drain reason), and it undrains a node
# whose reason is its own once the Node is not cordoned (slurm-operator
# `internal/controller/nodeset/slurmcontrol/slurmcontrol.go` `nodeReasonPrefix`,
# `internal/builder/workerbuilder/worker_app.go`).
SLINKY_REASON_PREFIX = "slurm-operator: "
GPU_UNHEALTHY = "GpuUnhealthy"
INSTANCE_ID_LABEL = "crusoe.ai/instance.id"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"

# Slinky slurm-operator: NodeSets own the slurmd pods, one Slurm node each.
NODESET_GROUP = "slinky.slurm.net"
NODESET_VERSION = "v1beta1"
NODESET_PLURAL = "nodesets"
SLURM_NODE_LABEL = "nodeset.slinky.slurm.net/pod-hostname"
POD_PROTECT_LABEL = "nodeset.slinky.slurm.net/pod-protect"
POD_CORDON_ANNOTATION = "nodeset.slinky.slurm.net/pod-cordon"

_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class CordonNodeInput(BaseModel):
    node: str
    incident_id: str
    phase: str  # the runbook phase, e.g. quarantine or repair: the taint's and label's value
    reason: str  # becomes the Slurm drain reason on Slinky

    @field_validator("phase")
    @classmethod
    def _label_value(cls, v: str) -> str:
        if not v or not _LABEL_VALUE.match(v):
            raise ValueError(f"phase {v!r} must be a Kubernetes label value")
        return v


class CordonNodeResult(BaseModel):
    cordoned: bool  # the node takes no new pods now
    changed: bool  # this call wrote to the node
    foreign: bool = False  # someone else had cordoned it; their cordon was left as it was
    previous_incident: str | None = None  # an earlier incident of ours whose marks we took over
    detail: str = ""


class UncordonNodeInput(BaseModel):
    node: str
    incident_id: str
    # Lift only the cordon (Slinky drains a cordoned Node's Slurm node) and keep the
    # remediation taint, label and marks, so that no other pod is scheduled onto the node
    # while it is still on trial (the burn-in screen). The final uncordon lifts the rest.
    keep_taint: bool = False


class UncordonNodeResult(BaseModel):
    uncordoned: bool  # nothing of ours keeps the node out of scheduling now
    changed: bool
    foreign: bool = False  # a cordon that is not this incident's stays in place
    detail: str = ""


class EvictPodsInput(BaseModel):
    node: str
    timeout_s: float = 300
    force_after_timeout: bool = False  # then delete what is left with grace 0
    skip_slurmd: bool = True  # a slurmd pod leaves only after Slurm drained the node
    grace_period_s: int | None = None  # None: each pod's own terminationGracePeriodSeconds
    poll_s: float = 1.0  # first retry delay after a refusal; doubles up to max_backoff_s
    max_backoff_s: float = 10.0


class EvictPodsResult(BaseModel):
    evicted: list[str] = Field(default_factory=list)  # namespace/name
    skipped: dict[str, str] = Field(default_factory=dict)  # namespace/name -> why
    forced: list[str] = Field(default_factory=list)
    waited_s: float = 0.0


class WaitNewNodeInput(BaseModel):
    node: str
    old_provider_id: str  # "" when unknown
    old_boot_id: str  # "" when unknown
    # Cordoned the moment the new machine's Node appears, Ready or not: a Node that joins
    # uncordoned invites pods, and on Slinky the operator undrains its Slurm node.
    cordon: CordonNodeInput | None = None
    poll_s: float = 0.5


class NodeIdentityInput(BaseModel):
    node: str


class NodeIdentity(BaseModel):
    """Which machine is behind a node: remembered before a repair, compared after it."""

    node: str
    uid: str
    provider_id: str
    boot_id: str
    instance_id: str  # the `crusoe.ai/instance.id` label; "" off Crusoe
    ready: bool
    unschedulable: bool
    labels: dict[str, str] = Field(default_factory=dict)


class SetNodeConditionInput(BaseModel):
    node: str
    unhealthy: bool  # True sets GpuUnhealthy=True; False clears it (GpuUnhealthy=False)
    reason: str  # CamelCase, e.g. Xid79 or HealthGatePassed
    message: str = ""


class SetNodeConditionResult(BaseModel):
    changed: bool
    status: str  # the condition's status now: "True", "False", or "" when never set


class FindSlurmdPodInput(BaseModel):
    node: str


class SlurmdPod(BaseModel):
    namespace: str
    name: str
    uid: str
    nodeset: str  # the owning NodeSet; "" when only the labels say slurmd
    slurm_node: str  # the Slurm node name the pod registers as
    phase: str
    ready: bool
    protected: bool  # busy in Slurm: the operator's PDB blocks its eviction
    cordoned: bool  # the operator has asked Slurm to drain it
    terminating: bool


class FindSlurmdPodResult(BaseModel):
    pod: SlurmdPod | None = None


# -- reading the API's objects (as JSON) in these terms ------------------------------

Obj = dict[str, Any]


def metadata_of(obj: Obj) -> Obj:
    meta: Obj = obj.get("metadata") or {}
    return meta


def pod_ref(pod: Obj) -> str:
    return f"{metadata_of(pod)['namespace']}/{metadata_of(pod)['name']}"


def is_ready(obj: Obj) -> bool:
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _owners(obj: Obj) -> list[Obj]:
    return list(metadata_of(obj).get("ownerReferences") or [])


def is_slurmd(pod: Obj) -> bool:
    labels = metadata_of(pod).get("labels") or {}
    owned = any(
        r.get("kind") == "NodeSet" and str(r.get("apiVersion", "")).startswith(f"{NODESET_GROUP}/")
        for r in _owners(pod)
    )
    return owned or SLURM_NODE_LABEL in labels or labels.get("app.kubernetes.io/name") == "slurmd"


def drain_skip_reason(pod: Obj, *, skip_slurmd: bool) -> str | None:
    """Why a drain leaves this pod alone, as `kubectl drain --ignore-daemonsets` would."""
    if any(r.get("kind") == "DaemonSet" and r.get("controller") for r in _owners(pod)):
        return "DaemonSet pod: its controller would recreate it on the node at once"
    if MIRROR_ANNOTATION in (metadata_of(pod).get("annotations") or {}):
        return "mirror pod: static, managed by the kubelet"
    if skip_slurmd and is_slurmd(pod):
        return "slurmd pod: drain through Slurm first"
    return None


def is_unschedulable(node: Obj) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def our_taints(node: Obj) -> list[Obj]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == TAINT_KEY]


def other_taints(node: Obj) -> list[Obj]:
    """Everyone else's taints, as the server sent them: `spec.taints` is replaced whole."""
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != TAINT_KEY]


def identity_of(node: Obj) -> NodeIdentity:
    meta, status = metadata_of(node), node.get("status") or {}
    labels = meta.get("labels") or {}
    provider_id = (node.get("spec") or {}).get("providerID") or ""
    instance_id = labels.get(INSTANCE_ID_LABEL, "")
    if not instance_id and provider_id.startswith("crusoe://"):
        instance_id = provider_id.removeprefix("crusoe://")
    return NodeIdentity(
        node=meta["name"],
        uid=meta.get("uid", ""),
        provider_id=provider_id,
        boot_id=(status.get("nodeInfo") or {}).get("bootID") or "",
        instance_id=instance_id,
        ready=is_ready(node),
        unschedulable=is_unschedulable(node),
        labels=labels,
    )


def slurmd_pod_of(pod: Obj) -> SlurmdPod:
    meta = metadata_of(pod)
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    owner = next((r.get("name", "") for r in _owners(pod) if r.get("kind") == "NodeSet"), "")
    return SlurmdPod(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        nodeset=owner or labels.get("app.kubernetes.io/instance", ""),
        slurm_node=labels.get(SLURM_NODE_LABEL)
        or (pod.get("spec") or {}).get("hostname")
        or meta["name"],
        phase=(pod.get("status") or {}).get("phase") or "Unknown",
        ready=is_ready(pod),
        protected=labels.get(POD_PROTECT_LABEL) == "true",
        cordoned=annotations.get(POD_CORDON_ANNOTATION) == "true",
        terminating=bool(meta.get("deletionTimestamp")),
    )
