"""The topology page's model: every node, grouped IB pod -> leaf -> node set, each with
the state an operator reads off its tile.

Built from what the cluster already records, never guessed: Slurm's node list (state,
reason, GPUs), the provisioning workflow's node sets and `topology.conf`, the policy's
topology (which wins where it names a node), the open incidents and the fleet guard.
A node none of them places sits under pod/leaf "unplaced" rather than disappearing.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from autoclusters.core.guard import GuardStatus, floor_of
from autoclusters.core.models import REASON_PREFIX, SPARE_REASON, IncidentState, SlurmNode
from autoclusters.core.policy import NodeTopology
from autoclusters.core.sharing import LENT_REASON, MOVE_REASON_PREFIX, is_sharing_reason
from autoclusters.core.topology_conf import parse_topology_conf as parse_topology_conf

NodeState = Literal[
    "in_service",
    "quarantined",
    "repairing",
    "waiting_approval",
    "spare",
    "lent",
    "moving",
    "failed",
]
STATE_LABELS: dict[str, str] = {
    "in_service": "in service",
    "quarantined": "quarantined",
    "repairing": "repairing",
    "waiting_approval": "waiting for approval",
    "spare": "spare",
    "lent": "lent to inference",
    "moving": "moving (training ↔ inference)",
    "failed": "failed",
}
UNPLACED = "unplaced"
DENSE_ABOVE = 48  # nodes: more than this and tiles with text no longer fit a screen
DEFAULT_SET = "nodes"
# The steps during which the machine itself is being worked on (a reset, reboot, new VM).
REPAIR_STEPS = {"repair", "plan_repair"}

_GPUS = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


class Tile(BaseModel):
    node: str
    state: NodeState
    label: str
    gpus: int | None = None
    fault: str = ""
    incident_id: str = ""
    detail: str = ""  # Slurm's state and reason, or what the incident waits on


class NodeGroup(BaseModel):
    name: str  # node set / node pool
    tiles: list[Tile]


class Leaf(BaseModel):
    name: str
    groups: list[NodeGroup]


class Pod(BaseModel):
    name: str
    leaves: list[Leaf]


class GuardView(BaseModel):
    running: bool
    breaker: Literal["closed", "tripped", "unknown"] = "unknown"
    breaker_detail: str = ""
    spares: list[str] = Field(default_factory=list)
    repairing: list[str] = Field(default_factory=list)
    queued: int = 0
    max_concurrent_repairs: int | None = None
    # The floor the guard keeps ("in service 3 of 4, floor 3"), and the critical nodes
    # whose drain it holds there (they still take new jobs), in arrival order.
    floor_detail: str = ""
    held_at_floor: list[str] = Field(default_factory=list)


class TopologyView(BaseModel):
    cluster: str
    updated_at: datetime  # when the read this view comes from started
    guard: GuardView
    pods: list[Pod]
    counts: dict[str, int]
    errors: list[str] = Field(default_factory=list)  # a source that could not be read
    # One small cell per node instead of a tile above this many nodes (the page's choice).
    dense: bool = False
    labels: dict[str, str] = Field(default_factory=lambda: dict(STATE_LABELS))
    faults: list[str] = Field(default_factory=list)  # the open incidents' faults, for a filter
    node_sets: list[str] = Field(default_factory=list)
    stale_after_s: float = 0  # an answer older than this says it is stale (the Age header)


def gpu_count(gres: str) -> int | None:
    found = _GPUS.search(gres or "")
    return int(found.group(1)) if found else None


def node_state(
    slurm: SlurmNode | None, incident: IncidentState | None, guard: GuardStatus | None
) -> tuple[NodeState, str]:
    """The tile's state and the line under it that says why."""
    if incident is not None and incident.status == "open" and incident.mode != "observe":
        waiting = incident.waiting_for
        if waiting is not None and waiting.kind == "approval" and incident.lemon:
            return "waiting_approval", "lemon: repaired too often, held until an approver says"
        if waiting is not None and waiting.kind == "approval":
            return "waiting_approval", f"waiting for approval of {waiting.step or 'a step'}"
        if incident.current_step in REPAIR_STEPS:
            return "repairing", f"{incident.rung or 'repair'} in progress"
        if waiting is not None:
            return "quarantined", waiting.detail or f"waiting ({waiting.kind})"
        return "quarantined", f"incident step {incident.current_step or 'starting'}"
    spares = (guard.state.spares or []) if guard else []
    if slurm is None:
        return "failed", "not in Slurm"
    if slurm.name in spares or slurm.reason.startswith(SPARE_REASON):
        return "spare", "hot spare, drained out of the partition"
    shown = slurm.display_state + (f": {slurm.reason}" if slurm.reason else "")
    if slurm.drained and slurm.reason == LENT_REASON:
        return "lent", "serving inference (Kubernetes), drained in Slurm"
    if slurm.drained and is_sharing_reason(slurm.reason):
        # The drain reason keeps the feature's old name (core/sharing.py): say the new one.
        move = slurm.reason.removeprefix(MOVE_REASON_PREFIX).strip()
        return "moving", f"GPU sharing: move {move}, {slurm.display_state} in Slurm"
    if not slurm.responding:
        return "failed", shown
    if slurm.drained:
        left = guard is not None and slurm.name in guard.state.left_out
        ours = slurm.reason.startswith(REASON_PREFIX)
        return ("failed" if left or ours else "quarantined"), shown
    return "in_service", shown


def build(
    *,
    cluster: str,
    now: datetime,
    slurm_nodes: list[SlurmNode],
    node_sets: dict[str, list[str]],
    placements: dict[str, NodeTopology],
    open_incidents: list[IncidentState],
    guard: GuardStatus | None,
    errors: list[str] | None = None,
) -> TopologyView:
    by_name = {n.name: n for n in slurm_nodes}
    incidents = {i.request.node: i for i in open_incidents if i.status == "open"}
    set_of = {node: name for name, nodes in node_sets.items() for node in nodes}
    names = sorted({*by_name, *set_of})
    tree: dict[str, dict[str, dict[str, list[Tile]]]] = {}
    counts: dict[str, int] = dict.fromkeys(STATE_LABELS, 0)
    for name in names:
        slurm = by_name.get(name)
        inc = incidents.get(name)
        state, detail = node_state(slurm, inc, guard)
        counts[state] += 1
        tile = Tile(
            node=name,
            state=state,
            label=STATE_LABELS[state],
            gpus=gpu_count(slurm.gres) if slurm else None,
            fault=inc.request.fault if inc else "",
            incident_id=inc.request.incident_id if inc else "",
            detail=detail,
        )
        place = placements.get(name, NodeTopology())
        pod, leaf = place.pod or UNPLACED, place.leaf or UNPLACED
        tree.setdefault(pod, {}).setdefault(leaf, {}).setdefault(
            set_of.get(name, DEFAULT_SET), []
        ).append(tile)
    pods = [
        Pod(
            name=pod,
            leaves=[
                Leaf(
                    name=leaf, groups=[NodeGroup(name=g, tiles=t) for g, t in sorted(sets.items())]
                )
                for leaf, sets in sorted(leaves.items())
            ],
        )
        for pod, leaves in sorted(tree.items())
    ]
    tiles = [t for p in pods for lf in p.leaves for g in lf.groups for t in g.tiles]
    return TopologyView(
        cluster=cluster,
        updated_at=now,
        guard=guard_view(guard),
        pods=pods,
        counts=counts,
        errors=errors or [],
        dense=len(names) > DENSE_ABOVE,
        faults=sorted({t.fault for t in tiles if t.fault}),
        node_sets=sorted({g.name for p in pods for lf in p.leaves for g in lf.groups}),
    )


# A tile's fields the JSON leaves out when empty: 2,000 nodes' poll stays under 200 KB.
_OMIT_EMPTY = ("fault", "incident_id", "detail")


def to_json(view: TopologyView) -> tuple[bytes, str]:
    """The poll's JSON, compact: no spaces, a tile's label is `labels[state]` (given once)
    and its empty fields are left out; and a hash of all of it but `updated_at`, the same
    for two reads that found the cluster the same (the answer's ETag)."""
    doc = view.model_dump(mode="json")
    updated = json.dumps({"updated_at": doc.pop("updated_at")}).encode()
    for pod in doc["pods"]:
        for leaf in pod["leaves"]:
            for group in leaf["groups"]:
                for tile in group["tiles"]:
                    del tile["label"]
                    for key in _OMIT_EMPTY:
                        if not tile[key]:
                            del tile[key]
    rest = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return updated[:-1] + b"," + rest[1:], hashlib.blake2b(rest, digest_size=12).hexdigest()


def guard_view(guard: GuardStatus | None) -> GuardView:
    if guard is None:
        return GuardView(running=False)
    b = guard.state.breaker
    detail = ""
    if b.tripped:
        where = b.shared_leaf and f"leaf {b.shared_leaf}" or b.shared_pod and f"pod {b.shared_pod}"
        detail = f"tripped by {', '.join(b.nodes)}" + (f" (all behind {where})" if where else "")
    elif b.reset_by:
        detail = f"reset by {b.reset_by}"
    return GuardView(
        running=True,
        breaker="tripped" if b.tripped else "closed",
        breaker_detail=detail,
        spares=list(guard.state.spares or []),
        repairing=sorted(guard.state.repairing),
        queued=len(guard.state.queue),
        max_concurrent_repairs=guard.policy.max_concurrent_repairs,
        floor_detail=floor_detail(guard),
        held_at_floor=[w.node for w in guard.state.queue if w.kind == "held_drain"],
    )


def floor_detail(guard: GuardStatus) -> str:
    """How far the cluster is from the guard's floor, as the guard counts it."""
    st = guard.state
    if st.cluster_nodes < 1:
        return ""  # the guard has not seen Slurm yet
    in_service = st.cluster_nodes - len(st.counted_out())
    floor = floor_of(guard.policy, st.cluster_nodes)
    return f"in service {in_service} of {st.cluster_nodes}, floor {floor}"
