"""What `ClusterProvisioning` asks its provider and records: the provider interface's
inputs and results, the cluster's progress, and the Slurm topology it writes.

The provider (sandbox, Crusoe Managed Slurm, Slinky on CMK) is reached only through the
`cluster_*` activities (activities/contracts.py); a provider refuses for quota or capacity
with an ApplicationError of type QuotaExceeded / CapacityUnavailable (non-retryable), whose
message the workflow fails with.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from autoclusters.core.cluster_spec import (
    MAX_MACHINE_ATTEMPTS,
    ClusterSpec,
    NodeSetSpec,
    Provider,
    UserSpec,
)
from autoclusters.core.models import StepRecord
from autoclusters.core.policy import Policy

CLUSTER_PROVISIONING_WORKFLOW = "ClusterProvisioning"

# Provider refusals that no retry or replacement can fix: the workflow fails with the
# provider's message and deletes what it created (unless the spec says keep).
QUOTA_EXCEEDED = "QuotaExceeded"
CAPACITY_UNAVAILABLE = "CapacityUnavailable"
FATAL_PROVIDER_ERRORS = (QUOTA_EXCEEDED, CAPACITY_UNAVAILABLE)
# A machine that will not boot (the provider says so): replaced, not retried.
BOOT_FAILED = "BootFailed"


def provisioning_workflow_id(cluster: str) -> str:
    return f"cluster-provisioning-{cluster}"


class ClusterRef(BaseModel):
    """Which cluster, on which provider: what every provider call carries."""

    name: str
    provider: Provider
    location: str


ResourceKind = Literal["controller", "accounting", "shared_home", "login", "machine"]


class Resource(BaseModel):
    """Something the provider created (and bills): deleted on failure, in reverse order."""

    kind: ResourceKind
    id: str  # the provider's id (a VM, a volume, a Managed Slurm cluster)
    name: str


class ProviderCall(BaseModel):
    """Create the controller, accounting, shared home or login nodes of `spec`'s cluster."""

    cluster: ClusterRef
    spec: ClusterSpec
    controller: Resource | None = None  # what the later steps attach to


class MachineCall(BaseModel):
    cluster: ClusterRef
    node_set: NodeSetSpec
    node: str  # the Slurm node name of the slot; a replacement keeps it
    attempt: int = Field(ge=1)


class Machine(BaseModel):
    cluster: ClusterRef
    node_set: str
    node: str
    machine_id: str
    attempt: int = 1

    def resource(self) -> Resource:
        return Resource(kind="machine", id=self.machine_id, name=self.node)


class BootResult(BaseModel):
    booted: bool
    detail: str = ""


class TopologyCall(BaseModel):
    cluster: ClusterRef
    machines: list[Machine]


class Placement(BaseModel):
    """Where one machine sits in the InfiniBand fabric, as the provider reports it."""

    node: str
    pod: str | None = None  # scalable unit / spine group
    leaf: str | None = None  # leaf switch


class NodeSetNodes(BaseModel):
    name: str
    partition: str
    gpus_per_node: int
    nodes: list[str]


class SlurmConfigCall(BaseModel):
    cluster: ClusterRef
    node_sets: list[NodeSetNodes]
    machines: list[Machine]
    topology_conf: str
    accounting: bool
    # Nodes that register drained under this reason (they take no job until undrained):
    # a scale up's new nodes until they pass the gate.
    drained: dict[str, str] = Field(default_factory=dict)


class SlurmConfigResult(BaseModel):
    registered: list[str]  # the nodes that registered with slurmctld within the call


class NodeGateCall(BaseModel):
    cluster: ClusterRef
    machine: Machine
    expected_gpus: int


class AcceptanceCall(BaseModel):
    cluster: ClusterRef
    node_set: NodeSetNodes


class AcceptanceResult(BaseModel):
    node_set: str
    passed: bool
    detail: str = ""
    job_id: int | None = None
    nodes: list[str] = Field(default_factory=list)


class UsersCall(BaseModel):
    cluster: ClusterRef
    users: list[UserSpec]
    accounting: bool  # Slurm accounts and associations need slurmdbd


class UsersResult(BaseModel):
    added: list[str] = Field(default_factory=list)


class DeleteCall(BaseModel):
    cluster: ClusterRef
    resource: Resource


# --- the workflow's input and state ----------------------------------------------------------


class ClusterProvisioningInput(BaseModel):
    spec: ClusterSpec
    policy: Policy  # resolved from the spec (a file, inline, or the default)
    # Per node slot: machines tried before the cluster fails (boot or gate failures).
    machine_attempts: int = Field(default=3, ge=1, le=MAX_MACHINE_ATTEMPTS)
    boot_timeout_s: float = Field(default=1800, gt=0, le=86400, allow_inf_nan=False)
    # The gate also waits (the policy's agent_report_timeout_s) for the node's own agent
    # to report the machine healthy, as the runbook's gate does. Off only where no agent
    # runs (a test of the workflow alone): a node then passes on Slurm's word.
    agent_gate: bool = True


NodeStage = Literal["requested", "booted", "registered", "healthy", "failed"]
_ORDER: dict[str, int] = {"requested": 0, "booted": 1, "registered": 2, "healthy": 3}


class NodeSetProgress(BaseModel):
    requested: int = 0
    booted: int = 0
    registered: int = 0
    healthy: int = 0
    replaced: int = 0  # machines replaced after a failed boot or gate


ClusterStatus = Literal["provisioning", "ready", "failed"]


class ClusterState(BaseModel):
    cluster: str
    provider: Provider
    status: ClusterStatus = "provisioning"
    current_step: str | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    # Each slot's furthest stage with its current machine.
    nodes: dict[str, NodeStage] = Field(default_factory=dict)
    node_sets: dict[str, list[str]] = Field(default_factory=dict)  # set -> its slots
    replaced: dict[str, int] = Field(default_factory=dict)  # set -> machines replaced
    resources: list[Resource] = Field(default_factory=list)  # alive, in creation order
    deleted: list[Resource] = Field(default_factory=list)
    cleanup_failures: list[str] = Field(default_factory=list)
    topology_conf: str = ""
    acceptance: list[AcceptanceResult] = Field(default_factory=list)
    users: list[str] = Field(default_factory=list)
    guard_workflow_id: str | None = None
    failure: str | None = None
    ready_at: datetime | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def progress(self) -> dict[str, NodeSetProgress]:
        """Per node set: machines requested / booted / registered / healthy (cumulative:
        a healthy node is also booted and registered)."""
        out: dict[str, NodeSetProgress] = {}
        for name, slots in self.node_sets.items():
            p = NodeSetProgress(requested=len(slots), replaced=self.replaced.get(name, 0))
            for node in slots:
                reached = _ORDER.get(self.nodes.get(node, "failed"), -1)
                p.booted += reached >= 1
                p.registered += reached >= 2
                p.healthy += reached >= 3
            out[name] = p
        return out

    def progress_line(self) -> str:
        return "; ".join(
            f"{name}: {p.requested} requested, {p.booted} booted, {p.registered} registered, "
            f"{p.healthy} healthy"
            for name, p in self.progress.items()
        )


# --- Slurm topology/tree --------------------------------------------------------------------

_SWITCH_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
UNPLACED_LEAF = "unplaced"


def _switch(name: str) -> str:
    return _SWITCH_BAD.sub("_", name.strip())[:64] or "_"


def render_topology(placements: list[Placement]) -> str:
    """Slurm `topology.conf` for `TopologyType=topology/tree`: one switch per leaf with its
    nodes, one per pod with its leaves, and a root over the pods when there are several.

    Nodes whose leaf the provider does not know hang off an `unplaced` leaf: a node missing
    from the tree could never be scheduled. Switch names are sanitised to what Slurm takes;
    output is sorted, so the same fabric always renders the same text.
    """
    if not placements:
        return ""
    leaves: dict[str, set[str]] = {}
    pods: dict[str, set[str]] = {}
    for p in placements:
        leaf = _switch(p.leaf) if p.leaf else UNPLACED_LEAF
        leaves.setdefault(leaf, set()).add(p.node)
        if p.pod:
            pods.setdefault(_switch(p.pod), set()).add(leaf)
    # Switch names are one namespace: a pod named like a leaf is renamed.
    pods = {(f"pod_{pod}" if pod in leaves else pod): ls for pod, ls in pods.items()}
    # A leaf claimed by no pod, or by several (a provider's inconsistency), is placed under
    # the root directly so every node stays reachable once.
    owners: dict[str, list[str]] = {}
    for pod, ls in pods.items():
        for leaf in ls:
            owners.setdefault(leaf, []).append(pod)
    lines = ["# Generated by AutoClusters ClusterProvisioning (topology/tree)."]
    for leaf in sorted(leaves):
        lines.append(f"SwitchName={leaf} Nodes={','.join(sorted(leaves[leaf]))}")
    top: list[str] = []
    for pod in sorted(pods):
        mine = sorted(leaf for leaf in pods[pod] if owners[leaf] == [pod])
        if mine:
            lines.append(f"SwitchName={pod} Switches={','.join(mine)}")
            top.append(pod)
    top += sorted(leaf for leaf in leaves if len(owners.get(leaf, [])) != 1)
    if len(top) > 1:
        root = "root"
        while root in leaves or root in pods:
            root = "_" + root
        lines.append(f"SwitchName={root} Switches={','.join(top)}")
    return "\n".join(lines) + "\n"
