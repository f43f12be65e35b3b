"""Health snapshots from the node agents, forwarded to the node's open incident.

A snapshot never starts anything: with an incident open on the node it becomes that
incident's `health_evidence` update (the health gate waits for a fresh healthy one after
each repair); without one, it goes the same way to the cluster's ClusterProvisioning,
ScaleNodeSet or GpuSharing (a node back from inference) if its gate waits for this node's
agent; else it is accepted and dropped.
The update id is derived from the snapshot, so a resend is answered with the first answer
instead of being recorded twice.
"""

from __future__ import annotations

import time

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients.api.intake import TemporalUnavailable
from autoclusters.clients.api.temporal_gate import RETRYABLE
from autoclusters.core.cluster import provisioning_workflow_id
from autoclusters.core.cluster_ops import ops_workflow_id
from autoclusters.core.evidence import EvidenceAck, HealthSnapshot
from autoclusters.core.models import workflow_id
from autoclusters.core.sharing import sharing_workflow_id

UPDATE = "health_evidence"  # NodeRemediation.health_evidence, by name
QUERY = "wants_evidence"  # NodeRemediation.wants_evidence
# No workflow, or it has completed: no open incident to tell.
_NO_INCIDENT = {RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION}


class SnapshotAnswer(BaseModel):
    node: str
    forwarded: bool  # on the node's open incident (False: none open, nothing started)
    workflow_id: str
    incident_id: str | None = None
    detail: str = ""


async def forward(client: Client, cluster: str, snap: HealthSnapshot) -> SnapshotAnswer:
    """Give `snap` to the node's open incident, if there is one; else to the cluster's
    provisioning or scaling while its health gate waits for this node's agent. Raises
    TemporalUnavailable."""
    answer = await _offer(client, workflow_id(cluster, snap.node), snap, "no open incident")
    if answer.forwarded:
        return answer
    # Not the incident's (none open, or a closed one that wants nothing): a gate's?
    for wf_id in await _cluster_gates(client, cluster):
        offered = await _offer(client, wf_id, snap, "not running")
        if offered.forwarded:
            return offered
    return answer


# The cluster's workflows whose gates take agent evidence; which of them run is read at most
# this often (a snapshot arrives every few seconds from every node: one describe per
# workflow per interval, not per snapshot).
_GATE_CACHE_S = 2.0
_gates: dict[str, tuple[float, list[str]]] = {}


async def _cluster_gates(client: Client, cluster: str) -> list[str]:
    now = time.monotonic()
    cached = _gates.get(cluster)
    if cached is not None and now - cached[0] < _GATE_CACHE_S:
        return cached[1]
    running = []
    gates = (provisioning_workflow_id(cluster), ops_workflow_id(cluster))
    for wf_id in (*gates, sharing_workflow_id(cluster)):
        try:
            desc = await client.get_workflow_handle(wf_id).describe()
        except RPCError as e:
            if e.status in _NO_INCIDENT:
                continue
            if e.status in RETRYABLE:
                raise TemporalUnavailable(f"Temporal: {e.message}") from None
            raise
        if desc.status == WorkflowExecutionStatus.RUNNING:
            running.append(wf_id)
    _gates[cluster] = (now, running)
    return running


async def _offer(client: Client, wf_id: str, snap: HealthSnapshot, absent: str) -> SnapshotAnswer:
    """Ask `wf_id` whether it wants `snap` and, if so, give it through the update."""
    handle = client.get_workflow_handle(wf_id)
    try:
        # Ask first (a query is not recorded): most snapshots repeat what the workflow
        # knows, and an update, even a refused one, may cost history events.
        if not await handle.query(QUERY, snap, result_type=bool):
            return SnapshotAnswer(
                node=snap.node, forwarded=False, workflow_id=wf_id, detail="nothing new"
            )
        ack = await handle.execute_update(
            UPDATE, snap, id=f"health-{snap.snapshot_id}", result_type=EvidenceAck
        )
    except RPCError as e:
        if e.status in _NO_INCIDENT:
            return SnapshotAnswer(node=snap.node, forwarded=False, workflow_id=wf_id, detail=absent)
        if e.status in RETRYABLE:
            raise TemporalUnavailable(f"Temporal: {e.message}") from None
        raise
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise TemporalUnavailable("Temporal did not answer in time", kind="timeout") from None
    except WorkflowQueryFailedError as e:  # a workflow that cannot answer: keep nothing
        return SnapshotAnswer(node=snap.node, forwarded=False, workflow_id=wf_id, detail=str(e))
    except WorkflowUpdateFailedError as e:  # the workflow refused it (closing)
        return SnapshotAnswer(
            node=snap.node, forwarded=False, workflow_id=wf_id, detail=str(e.cause or e)
        )
    return SnapshotAnswer(
        node=snap.node,
        forwarded=ack.kept,
        workflow_id=wf_id,
        incident_id=ack.incident_id,
        detail="" if ack.kept else "already recorded",
    )
