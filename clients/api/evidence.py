"""Health snapshots from the node agents, forwarded to the node's open incident.

A snapshot never starts anything: with an incident open on the node it becomes that
incident's `health_evidence` update (the health gate waits for a fresh healthy one after
each repair); without one it is accepted and dropped. The update id is derived from the
snapshot, so a resend is answered with the first answer instead of being recorded twice.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients.api.intake import TemporalUnavailable
from autoclusters.core.evidence import EvidenceAck, HealthSnapshot
from autoclusters.core.models import workflow_id

UPDATE = "health_evidence"  # NodeRemediation.health_evidence, by name
QUERY = "wants_evidence"  # NodeRemediation.wants_evidence
# No workflow, or it has completed: no open incident to tell.
_NO_INCIDENT = {RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION}
_RETRYABLE = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.ABORTED,
    RPCStatusCode.CANCELLED,
}


class SnapshotAnswer(BaseModel):
    node: str
    forwarded: bool  # on the node's open incident (False: none open, nothing started)
    workflow_id: str
    incident_id: str | None = None
    detail: str = ""


async def forward(client: Client, cluster: str, snap: HealthSnapshot) -> SnapshotAnswer:
    """Give `snap` to the node's open incident, if there is one; raises TemporalUnavailable."""
    wf_id = workflow_id(cluster, snap.node)
    handle = client.get_workflow_handle(wf_id)
    try:
        # Ask first (a query is not recorded): most snapshots repeat what the incident
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
            return SnapshotAnswer(
                node=snap.node, forwarded=False, workflow_id=wf_id, detail="no open incident"
            )
        if e.status in _RETRYABLE:
            raise TemporalUnavailable(f"Temporal: {e.message}") from None
        raise
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise TemporalUnavailable("Temporal did not answer in time", kind="timeout") from None
    except WorkflowQueryFailedError as e:  # an incident that cannot answer: keep nothing
        return SnapshotAnswer(node=snap.node, forwarded=False, workflow_id=wf_id, detail=str(e))
    except WorkflowUpdateFailedError as e:  # the incident refused it (closing)
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
