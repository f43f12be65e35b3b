"""Opening, listing and reading incidents: the operations behind `autoclusters incident`."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError

from autoclusters import temporal
from autoclusters.models import IncidentRequest, IncidentState, RemediationTimeouts, workflow_id
from autoclusters.settings import Settings
from autoclusters.slurm import SlurmCli, UnknownNodeError
from workflows.remediation import NodeRemediation


class IncidentNotFound(LookupError):
    pass


class OpenedIncident(BaseModel):
    incident_id: str
    workflow_id: str
    run_id: str
    joined: bool  # True: the node already had an open incident, and this is it


class IncidentSummary(BaseModel):
    incident_id: str
    node: str
    fault: str
    workflow_id: str
    status: str
    started_at: datetime | None
    closed_at: datetime | None


def new_incident_id(node: str, at: datetime) -> str:
    return f"inc-{at.strftime('%Y%m%d-%H%M%S')}-{node}"


async def open_incident(
    client: Client, settings: Settings, node: str, fault: str, opened_by: str = "cli"
) -> OpenedIncident:
    """Start the node's remediation, or join the incident already open on it.

    The node is checked against Slurm first: an unknown node starts nothing.
    """
    opened_at = datetime.now(UTC)
    req = IncidentRequest(
        incident_id=new_incident_id(node, opened_at),
        cluster=settings.cluster,
        node=node,
        fault=fault,
        opened_at=opened_at,
        opened_by=opened_by,
        timeouts=RemediationTimeouts(repair_s=settings.repair_timeout_s),
    )
    slurm = SlurmCli(settings.slurm_conf, settings.slurm_bin_dir)
    if await slurm.node(node) is None:
        raise UnknownNodeError(f"node {node} is not in Slurm cluster {settings.cluster}")
    wf_id = workflow_id(settings.cluster, node)
    handle = await client.start_workflow(
        NodeRemediation.run,
        req,
        id=wf_id,
        task_queue=settings.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(temporal.INCIDENT_ID, req.incident_id),
                SearchAttributePair(temporal.CLUSTER, req.cluster),
                SearchAttributePair(temporal.NODE, node),
                SearchAttributePair(temporal.FAULT, fault),
            ]
        ),
    )
    desc = await handle.describe()
    existing = desc.typed_search_attributes.get(temporal.INCIDENT_ID) or req.incident_id
    return OpenedIncident(
        incident_id=existing,
        workflow_id=wf_id,
        run_id=desc.run_id,
        joined=existing != req.incident_id,
    )


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status else "unknown"


async def list_incidents(
    client: Client, settings: Settings, open_only: bool = False
) -> list[IncidentSummary]:
    query = f"WorkflowType = 'NodeRemediation' AND Cluster = '{settings.cluster}'"
    if open_only:
        query += " AND ExecutionStatus = 'Running'"
    out = []
    async for wf in client.list_workflows(query):
        sa = wf.typed_search_attributes
        out.append(
            IncidentSummary(
                incident_id=sa.get(temporal.INCIDENT_ID) or "?",
                node=sa.get(temporal.NODE) or "?",
                fault=sa.get(temporal.FAULT) or "?",
                workflow_id=wf.id,
                status=_status_name(wf.status),
                started_at=wf.start_time,
                closed_at=wf.close_time,
            )
        )
    return out


async def find_incident(client: Client, settings: Settings, incident_id: str) -> WorkflowHandle:
    # The id names the node, so the node's workflow id is a direct look-up (no wait for
    # visibility); an older incident of that node is found through visibility.
    node = incident_id.split("-", 3)[-1] if incident_id.count("-") >= 3 else ""
    if node:
        handle = client.get_workflow_handle(workflow_id(settings.cluster, node))
        try:
            desc = await handle.describe()
            if desc.typed_search_attributes.get(temporal.INCIDENT_ID) == incident_id:
                return client.get_workflow_handle(desc.id, run_id=desc.run_id)
        except RPCError:
            pass
    async for wf in client.list_workflows(f"IncidentId = '{incident_id}'"):
        return client.get_workflow_handle(wf.id, run_id=wf.run_id)
    raise IncidentNotFound(f"no incident {incident_id} in cluster {settings.cluster}")


async def incident_state(handle: WorkflowHandle) -> tuple[IncidentState | None, str]:
    """The incident's timeline (from the `status` query) and its Temporal status."""
    desc = await handle.describe()
    state = await handle.query(NodeRemediation.status)
    return state, _status_name(desc.status)
