"""Opening, listing and reading incidents: the operations behind `autoclusters incident`."""

from __future__ import annotations

import contextlib
import uuid
from datetime import UTC, datetime

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients.incident_history import ladder_at_open, repairs_before
from autoclusters.clients.inventory import NodeInventory, SlurmInventory
from autoclusters.core.fault_evidence import FaultCleared, FaultEvidence
from autoclusters.core.faults import INCIDENT_ID_PATTERN, check_known_fault
from autoclusters.core.models import (
    ApprovalRecord,
    ApprovalRequest,
    FaultReport,
    IncidentRequest,
    IncidentState,
    RefusedApproval,
    RemediationTimeouts,
    workflow_id,
)
from autoclusters.core.policy import Policy
from autoclusters.core.settings import Settings, policy_for
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import UnknownNodeError
from autoclusters.workflows.remediation import NodeRemediation


class IncidentNotFound(LookupError):
    pass


class DecisionRefused(PermissionError):
    pass


class OpenedIncident(BaseModel):
    incident_id: str
    workflow_id: str
    run_id: str
    joined: bool  # True: the node already had an open incident, and this is it
    opened: bool = False  # this call opened it: true for exactly one caller per incident
    repeat: bool = False  # the incident had this report (its key) already: nothing new


class IncidentSummary(BaseModel):
    incident_id: str
    node: str
    fault: str
    workflow_id: str
    status: str  # Temporal's: running, completed, failed, ...
    state: str = ""  # the incident's own: open, waiting_approval, resolved, ...
    action: str = ""  # the rung: reboot, replace, ...
    started_at: datetime | None
    closed_at: datetime | None


def new_incident_id(node: str, at: datetime) -> str:
    return f"inc-{at.strftime('%Y%m%d-%H%M%S')}-{node}"


async def open_incident(
    client: Client,
    settings: Settings,
    node: str,
    fault: str,
    opened_by: str = "cli",
    policy: Policy | None = None,
    *,
    inventory: NodeInventory | None = None,
    key: str = "",
    evidence: FaultEvidence | None = None,
    at: datetime | None = None,
) -> OpenedIncident:
    """Open the node's incident, or join the one already open on it (no second drain).

    The node is checked first (against Slurm unless `inventory` says otherwise): an unknown
    node starts nothing. The incident carries a snapshot of the cluster's policy (`policy`
    overrides it, e.g. the demo's mode). `key`: the source's dedupe key; the incident
    answers a report whose key it has seen with `repeat` and records nothing. `evidence`
    (an alert's labels and annotations, an agent's readings) is kept on the fault, and `at`
    (an alert's startsAt) is the fault's time.

    Exactly one caller is told `opened`: each call carries a fresh token, and only the
    one whose start created the workflow holds the token the incident was opened with.
    """
    policy = policy or policy_for(settings)
    check_known_fault(fault, policy.faults)  # before anything is asked or started
    # The ladder's figures from the cluster's history, when the policy skips rungs (a policy
    # that does not reads nothing; a slow or failed read opens with the plain ladder).
    policy = await ladder_at_open(client).policy_for_open(settings.cluster, policy)
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
            repair_s=settings.repair_timeout_s, admission_poll_s=settings.admission_poll_s
        ),
        policy=policy,
        kubernetes=settings.kubeconfig is not None,
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
    )
    inventory = inventory or SlurmInventory.for_settings(settings)
    if not await inventory.known([node]):
        raise UnknownNodeError(f"node {node} is not in Slurm cluster {settings.cluster}")
    wf_id = workflow_id(settings.cluster, node)
    start = WithStartWorkflowOperation(
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
                SearchAttributePair(temporal.INCIDENT_STATUS, "open"),
            ]
        ),
        static_summary=f"{fault} on {node}",
        static_details=f"incident {req.incident_id}, opened by {opened_by}",
    )
    ack = await client.execute_update_with_start_workflow(
        NodeRemediation.report_fault, report, start_workflow_operation=start
    )
    handle = await start.workflow_handle()
    return OpenedIncident(
        incident_id=ack.incident_id,
        workflow_id=wf_id,
        run_id=handle.result_run_id or handle.run_id or "",
        joined=ack.joined,
        opened=ack.opened,
        repeat=ack.repeat,
    )


async def record_cleared(
    client: Client, settings: Settings, node: str, cleared: FaultCleared
) -> bool:
    """Tell the node's open incident that one of its faults cleared; False when no open
    incident has that fault (nothing is started for a resolved alert)."""
    handle = client.get_workflow_handle(workflow_id(settings.cluster, node))
    try:
        return bool(
            await handle.execute_update(
                NodeRemediation.fault_cleared, cleared, id=f"cleared-{cleared.key}"[:200]
            )
        )
    except RPCError as e:
        if e.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION):
            return False
        raise
    except WorkflowUpdateFailedError:  # closed, or not a fault of this incident
        return False


async def decide(
    client: Client,
    settings: Settings,
    incident_id: str,
    approver: str,
    approve: bool,
    comment: str = "",
    step: str | None = None,
) -> ApprovalRecord:
    """Approve or reject the step an incident waits on. A refusal (not an approver, wrong
    step, already decided) raises DecisionRefused and is recorded in the incident's history.

    `step`: the step the decision was shown for (a Slack button's, `approve --step`). The
    workflow refuses it unless the incident waits on exactly that step, so a replayed or
    stale decision can never approve a later, different step. None: the step it waits on
    now (the CLI shows which before it decides).
    """
    handle = await find_incident(client, settings, incident_id)
    state = await handle.query(NodeRemediation.status)
    if state.status != "open":
        raise DecisionRefused(f"incident {incident_id} is closed ({state.status})")
    waiting = state.waiting_for.step if state.waiting_for and state.waiting_for.step else "none"
    step = step or waiting
    req = ApprovalRequest(step=step, approver=approver, comment=comment)
    update = NodeRemediation.approve if approve else NodeRemediation.reject
    try:
        return await handle.execute_update(update, req)
    except RPCError as e:  # it closed between the query and the update
        raise DecisionRefused(f"incident {incident_id}: {e.message}") from e
    except WorkflowUpdateFailedError as e:
        reason = str(e.cause or e)
        # The validator's refusal leaves no trace in the history: record it there.
        with contextlib.suppress(RPCError):
            await handle.signal(
                NodeRemediation.approval_refused,
                RefusedApproval(
                    step=step, approver=approver, approved=approve, reason=reason,
                    at=datetime.now(UTC),
                ),
            )  # fmt: skip
        raise DecisionRefused(reason) from e


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status else "unknown"


async def list_incidents(
    client: Client,
    settings: Settings,
    state: str | None = None,
    node: str | None = None,
    fault: str | None = None,
    limit: int | None = None,
) -> list[IncidentSummary]:
    """Incidents of this cluster, newest first; `state` is the incident's own status
    (open, waiting_approval, resolved, failed, rejected, observed, monitored).
    `limit`: at most that many (None: all)."""
    query = f"WorkflowType = 'NodeRemediation' AND Cluster = {_quoted(settings.cluster)}"
    if state:
        query += f" AND IncidentStatus = {_quoted(state)}"
    if node:
        query += f" AND Node = {_quoted(node)}"
    if fault:
        query += f" AND Fault = {_quoted(fault)}"
    out = []
    async for wf in client.list_workflows(query, limit=limit):
        sa = wf.typed_search_attributes
        out.append(
            IncidentSummary(
                incident_id=sa.get(temporal.INCIDENT_ID) or "?",
                node=sa.get(temporal.NODE) or "?",
                fault=sa.get(temporal.FAULT) or "?",
                workflow_id=wf.id,
                status=_status_name(wf.status),
                state=sa.get(temporal.INCIDENT_STATUS) or "",
                action=sa.get(temporal.REPAIR_ACTION) or "",
                started_at=wf.start_time,
                closed_at=wf.close_time,
            )
        )
    return out


def _quoted(value: str) -> str:
    # Values come from the command line: keep them inside one string literal.
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


async def find_incident(client: Client, settings: Settings, incident_id: str) -> WorkflowHandle:
    if not INCIDENT_ID_PATTERN.match(incident_id):
        # Never let it near a visibility query: it would be query syntax, not an id.
        raise IncidentNotFound(
            f"{incident_id[:80]!r} is not an incident id (inc-YYYYMMDD-HHMMSS-<node>)"
        )
    # The id names the node, so the node's workflow id is a direct look-up (no wait for
    # visibility); an older incident of that node is found through visibility.
    node = incident_id.split("-", 3)[-1]
    if node:
        handle = client.get_workflow_handle(workflow_id(settings.cluster, node))
        try:
            desc = await handle.describe()
            if desc.typed_search_attributes.get(temporal.INCIDENT_ID) == incident_id:
                return client.get_workflow_handle(desc.id, run_id=desc.run_id)
        except RPCError:
            pass
    query = f"IncidentId = {_quoted(incident_id)} AND Cluster = {_quoted(settings.cluster)}"
    async for wf in client.list_workflows(query):
        return client.get_workflow_handle(wf.id, run_id=wf.run_id)
    raise IncidentNotFound(f"no incident {incident_id} in cluster {settings.cluster}")


async def incident_state(handle: WorkflowHandle) -> tuple[IncidentState | None, str]:
    """The incident's timeline (from the `status` query) and its Temporal status."""
    desc = await handle.describe()
    state = await handle.query(NodeRemediation.status)
    return state, _status_name(desc.status)
