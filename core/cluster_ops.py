"""What `ScaleNodeSet` and `ClusterTeardown` take, ask and record.

One owner per node: both run under the workflow id `cluster-ops-<cluster>` (one scale or
teardown of a cluster at a time), skip or wait for a node whose remediation incident
(`core.models.workflow_id`) is open, and drain under a reason of their own
(`autoclusters: <op id> SCALE_UP|SCALE_DOWN|TEARDOWN`, op ids starting `cluster-ops-`) that
the remediation runbook leaves alone (`is_ops_reason`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from autoclusters.core.cluster import ClusterRef, Machine, Resource
from autoclusters.core.cluster_spec import MAX_MACHINE_ATTEMPTS, ClusterSpec
from autoclusters.core.models import REASON_PREFIX, StepRecord

SCALE_NODE_SET_WORKFLOW = "ScaleNodeSet"
CLUSTER_TEARDOWN_WORKFLOW = "ClusterTeardown"
OPS_ID_PREFIX = "cluster-ops-"


def ops_workflow_id(cluster: str) -> str:
    """Scaling and teardown of one cluster share this id: one runs at a time."""
    return f"{OPS_ID_PREFIX}{cluster}"


def ops_key(cluster: str, run_id: str) -> str:
    """This operation's key: in its drain reasons and its requeue markers."""
    return f"{OPS_ID_PREFIX}{cluster}-{run_id[:8]}"


def is_ops_reason(reason: str) -> bool:
    """A drain written by a scale or teardown: the remediation runbook leaves the node alone."""
    return reason.startswith(f"{REASON_PREFIX} {OPS_ID_PREFIX}")


class Inventory(BaseModel):
    """What the provider holds for a cluster now: its resources in creation order (machines
    included) and the machines with their node set."""

    resources: list[Resource] = Field(default_factory=list)
    machines: list[Machine] = Field(default_factory=list)


class NodeLoad(BaseModel):
    node: str
    state: str = ""
    drained: bool = False
    reason: str = ""
    jobs: list[int] = Field(default_factory=list)  # running / completing jobs on the node


class NodeLoadCall(BaseModel):
    cluster: ClusterRef
    nodes: list[str]


class IncidentProbe(BaseModel):
    cluster: str
    node: str


class WorkflowProbe(BaseModel):
    workflow_id: str  # e.g. the cluster's provisioning: is it running now?


JobsMode = Literal["requeue", "wait"]


class ScaleNodeSetInput(BaseModel):
    spec: ClusterSpec
    node_set: str
    count: int = Field(ge=0, le=10_000)
    # Scale down: requeue the jobs of the nodes removed (each once), or wait for them to end.
    jobs: JobsMode = "requeue"
    machine_attempts: int = Field(default=3, ge=1, le=MAX_MACHINE_ATTEMPTS)
    boot_timeout_s: float = Field(default=1800, gt=0, le=86400, allow_inf_nan=False)
    idle_timeout_s: float = Field(default=3600, gt=0, le=7 * 86400, allow_inf_nan=False)
    incident_poll_s: float = Field(default=60, gt=0, le=3600, allow_inf_nan=False)
    # New nodes' gate also waits this long for their agent's healthy report (as
    # ClusterProvisioningInput.agent_gate).
    agent_gate: bool = True
    agent_report_timeout_s: float = Field(default=300, gt=0, le=3600, allow_inf_nan=False)


class TeardownInput(BaseModel):
    cluster: ClusterRef
    # Jobs are not requeued: after this long they are cancelled (the cluster is going away).
    grace_s: float = Field(default=600, ge=0, le=86400, allow_inf_nan=False)
    incident_poll_s: float = Field(default=60, gt=0, le=3600, allow_inf_nan=False)


OpsStatus = Literal["running", "done", "failed"]


class OpsState(BaseModel):
    cluster: str
    key: str = ""
    status: OpsStatus = "running"
    current_step: str | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    added: list[str] = Field(default_factory=list)  # nodes put into service
    removed: list[str] = Field(default_factory=list)  # nodes whose machine was deleted
    skipped: dict[str, str] = Field(default_factory=dict)  # node -> why not touched
    replaced: int = 0
    requeued: list[int] = Field(default_factory=list)
    deleted: list[Resource] = Field(default_factory=list)
    failure: str | None = None
