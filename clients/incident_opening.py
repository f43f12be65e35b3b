"""What opening (or joining) a node's incident sends, built once for every way the API and
the CLI send it (clients/incidents.py `open_incident`, clients/storm_calls.py): the
request a new incident would start with, carrying the cluster's policy, the node's
earlier repairs and a fresh token; the report; and where and how its workflow starts
(one per node, `USE_EXISTING`, its search attributes)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)

from autoclusters.clients.fabric_topology import with_fabric_topology
from autoclusters.clients.incident_history import ladder_at_open, repairs_before
from autoclusters.clients.inventory import NodeInventory, SlurmInventory
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.faults import check_known_fault
from autoclusters.core.models import (
    FaultReport,
    IncidentRequest,
    RemediationTimeouts,
    workflow_id,
)
from autoclusters.core.policy import Policy
from autoclusters.core.settings import Settings, policy_for
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import UnknownNodeError


def new_incident_id(node: str, at: datetime) -> str:
    return f"inc-{at.strftime('%Y%m%d-%H%M%S')}-{node}"


@dataclass(frozen=True)
class Opening:
    """What opening (or joining) a node's incident sends: the would-be incident's request,
    the report, and where the workflow starts."""

    req: IncidentRequest
    report: FaultReport
    start: dict[str, Any]  # start_workflow's keyword arguments, the workflow id among them


async def opening(
    client: Client,
    settings: Settings,
    node: str,
    fault: str,
    opened_by: str,
    policy: Policy | None,
    inventory: NodeInventory | None,
    key: str,
    evidence: FaultEvidence | None,
    at: datetime | None,
    alerts: int,
) -> Opening:
    """As `open_incident` documents: the fault kind is checked before anything is asked,
    the node before anything is started (UnknownNodeError)."""
    policy = policy or policy_for(settings)
    check_known_fault(fault, policy.faults)  # before anything is asked or started
    # The ladder's figures from the cluster's history, when the policy skips rungs (a policy
    # that does not reads nothing; a slow or failed read opens with the plain ladder).
    policy = await ladder_at_open(client).policy_for_open(settings.cluster, policy)
    # Where the node sits (the Nodes' labels, topology.conf), for systemic incidents
    # (docs/systemic.md).
    policy = await with_fabric_topology(settings, policy)
    # A node repaired too often is held after its repair (lemon nodes): its count, read now.
    prior_repairs = await repairs_before(client, settings.cluster, node, policy)
    opened_at = datetime.now(UTC)
    token = uuid.uuid4().hex
    req = IncidentRequest(
        incident_id=new_incident_id(node, opened_at),
        cluster=settings.cluster,
        node=node,
        fault=fault,
        opened_at=opened_at,
        opened_by=opened_by,
        timeouts=RemediationTimeouts(
            repair_s=settings.remediation.repair_timeout_s,
            admission_poll_s=settings.remediation.admission_poll_s,
        ),
        policy=policy,
        kubernetes=settings.kubernetes.kubeconfig is not None,
        open_token=token,
        prior_repairs=prior_repairs,
    )
    report = FaultReport(
        incident_id=req.incident_id,
        fault=fault,
        source=opened_by,
        at=at or opened_at,
        evidence=evidence,
        open_token=token,
        key=key,
        alerts=alerts,
    )
    inventory = inventory or SlurmInventory.for_settings(settings)
    if not await inventory.known([node]):
        raise UnknownNodeError(f"node {node} is not in Slurm cluster {settings.cluster}")
    start = {
        "id": workflow_id(settings.cluster, node),
        "task_queue": settings.temporal.task_queue,
        "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING,
        "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        "search_attributes": TypedSearchAttributes(
            [
                SearchAttributePair(temporal.INCIDENT_ID, req.incident_id),
                SearchAttributePair(temporal.CLUSTER, req.cluster),
                SearchAttributePair(temporal.NODE, node),
                SearchAttributePair(temporal.FAULT, fault),
                SearchAttributePair(temporal.INCIDENT_STATUS, "open"),
            ]
        ),
        "static_summary": f"{fault} on {node}",
        "static_details": f"incident {req.incident_id}, opened by {opened_by}",
    }
    return Opening(req, report, start)
