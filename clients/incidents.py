"""Opening, listing and reading incidents: the operations behind `autoclusters incident`."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients.incident_opening import opening
from autoclusters.clients.inventory import NodeInventory
from autoclusters.core.decision_proof import Decision, sign
from autoclusters.core.fault_evidence import FaultCleared, FaultEvidence
from autoclusters.core.faults import INCIDENT_ID_PATTERN
from autoclusters.core.models import (
    ApprovalRecord,
    ApprovalRequest,
    IncidentState,
    RefusedApproval,
    workflow_id,
)
from autoclusters.core.policy import TOPOLOGY_LEVELS, Policy
from autoclusters.core.settings import Settings
from autoclusters.core.systemic import SYSTEMIC_WORKFLOW
from autoclusters.core.systemic_member import systemic_workflow_id
from autoclusters.integrations import temporal
from autoclusters.integrations.temporal import quoted
from autoclusters.workflows.remediation import NodeRemediation


class IncidentNotFound(LookupError):
    pass


class SystemicIncidentFound(IncidentNotFound):
    """The id is a systemic incident's (docs/systemic.md), not a node's: read it with
    clients/systemic_incidents.py."""


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
    kind: Literal["node"] = "node"  # a node's incident (a systemic one: incident_listing.py)
    incident_id: str
    node: str
    fault: str
    workflow_id: str
    status: str  # Temporal's: running, completed, failed, ...
    state: str = ""  # the incident's own: open, waiting_approval, resolved, ...
    action: str = ""  # the rung: reboot, replace, ...
    started_at: datetime | None
    closed_at: datetime | None


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
    alerts: int = 1,
) -> OpenedIncident:
    """Open the node's incident, or join the one already open on it (no second drain).

    The node is checked first (against Slurm unless `inventory` says otherwise): an unknown
    node starts nothing. The incident carries a snapshot of the cluster's policy (`policy`
    overrides it, e.g. the demo's mode). `key`: the source's dedupe key; the incident
    answers a report whose key it has seen with `repeat` and records nothing. `evidence`
    (an alert's labels and annotations, an agent's readings) is kept on the fault, and `at`
    (an alert's startsAt) is the fault's time. `alerts`: how many alerts the report stands
    for (the API's batches; `key` covers them all).

    Exactly one caller is told `opened`: each call carries a fresh token, and only the
    one whose start created the workflow holds the token the incident was opened with.
    """
    o = await opening(
        client, settings, node, fault, opened_by, policy, inventory, key, evidence, at, alerts
    )
    start = WithStartWorkflowOperation(NodeRemediation.run, o.req, **o.start)
    ack = await client.execute_update_with_start_workflow(
        NodeRemediation.report_fault, o.report, start_workflow_operation=start
    )
    handle = await start.workflow_handle()
    return OpenedIncident(
        incident_id=ack.incident_id,
        workflow_id=o.start["id"],
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
    *,
    via: str,
) -> ApprovalRecord:
    """Approve or reject the step an incident waits on, as `approver`, whom the caller (the
    API) has verified `via` Slack's signature or their own token: the decision carries a
    proof signed with the first of `[approval] keys`, which the worker checks. A refusal (not
    an approver, wrong step, already decided, no key) raises DecisionRefused and is recorded
    in the incident's history.

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
    if not settings.approval.keys:
        raise DecisionRefused(
            "no approval keys ([approval] keys) configured on the API: it cannot vouch for anyone"
        )
    decision = Decision(incident_id, step, approver, approve, via)
    proof = sign(decision, settings.approval.keys[0].get_secret_value())
    req = ApprovalRequest(step=step, approver=approver, comment=comment, proof=proof)
    update = NodeRemediation.approve if approve else NodeRemediation.reject
    try:
        return await handle.execute_update(update, req)
    except RPCError as e:  # it closed between the query and the update
        raise DecisionRefused(f"incident {incident_id}: {e.message}") from e
    except WorkflowUpdateFailedError as e:
        reason = str(e.cause or e)
        if isinstance(e.cause, ApplicationError) and e.cause.type == "DecisionRefused":
            raise DecisionRefused(reason) from e  # the workflow recorded it itself
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
    query = f"WorkflowType = 'NodeRemediation' AND Cluster = {quoted(settings.cluster)}"
    if state:
        query += f" AND IncidentStatus = {quoted(state)}"
    if node:
        query += f" AND Node = {quoted(node)}"
    if fault:
        query += f" AND Fault = {quoted(fault)}"
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


async def _named(client: Client, wf_id: str, incident_id: str) -> WorkflowHandle | None:
    """The run of workflow `wf_id` when it is incident `incident_id` (None: no such
    workflow, or its latest run is another incident)."""
    handle = client.get_workflow_handle(wf_id)
    try:
        desc = await handle.describe()
    except RPCError:
        return None
    if desc.typed_search_attributes.get(temporal.INCIDENT_ID) != incident_id:
        return None
    return client.get_workflow_handle(desc.id, run_id=desc.run_id)


async def find_incident(client: Client, settings: Settings, incident_id: str) -> WorkflowHandle:
    """The incident's workflow: a node's NodeRemediation, or a systemic incident
    (SystemicIncident, docs/systemic.md), whose ids are shaped alike."""
    if not INCIDENT_ID_PATTERN.match(incident_id):
        # Never let it near a visibility query: it would be query syntax, not an id.
        raise IncidentNotFound(
            f"{incident_id[:80]!r} is not an incident id (inc-YYYYMMDD-HHMMSS-<node>)"
        )
    # The id names the node (a systemic incident's: its leaf, NVLink domain or rack), so
    # the workflow id is a direct look-up (no wait for visibility); an older incident is
    # found through visibility.
    name = incident_id.split("-", 3)[-1]
    if name:
        ids = [
            workflow_id(settings.cluster, name),
            *(systemic_workflow_id(settings.cluster, lvl, name) for lvl in TOPOLOGY_LEVELS),
        ]
        for wf_id in ids:
            if (found := await _named(client, wf_id, incident_id)) is not None:
                return found
    query = f"IncidentId = {quoted(incident_id)} AND Cluster = {quoted(settings.cluster)}"
    async for wf in client.list_workflows(query):
        return client.get_workflow_handle(wf.id, run_id=wf.run_id)
    raise IncidentNotFound(f"no incident {incident_id} in cluster {settings.cluster}")


async def incident_state(handle: WorkflowHandle) -> tuple[IncidentState | None, str]:
    """The incident's timeline (from the `status` query) and its Temporal status.
    SystemicIncidentFound: the handle is a systemic incident's, whose state is another."""
    desc = await handle.describe()
    if desc.workflow_type == SYSTEMIC_WORKFLOW:
        raise SystemicIncidentFound(
            f"{desc.typed_search_attributes.get(temporal.INCIDENT_ID) or desc.id} is a "
            "systemic incident (docs/systemic.md): `autoclusters incident show` and the "
            "console's /ui/systemic/ page show it"
        )
    state = await handle.query(NodeRemediation.status)
    return state, _status_name(desc.status)
