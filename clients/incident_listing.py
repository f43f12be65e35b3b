"""The cluster's incidents as one list: the nodes' incidents (NodeRemediation) beside the
systemic incidents (SystemicIncident, docs/systemic.md), newest first, each row with its
`kind`. What `autoclusters incident list` prints and `GET /v1/incidents` returns.

The two halves are read apart, and a half that cannot be read is said to be unknown
(`IncidentListing.unknown`), never shown as "no incidents": the other half is still listed.
Only when neither half can be read does the read fail as a whole.

A systemic incident's members and state live in its `status` query, not in search
attributes, so the filters (state, node, fault) are applied to it here, after the query:
a node filter matches a systemic incident that has the node as a member, a fault filter
one with a member opened for that fault. A systemic incident whose query fails (no worker
answered) is listed with its state and members unknown, filters or not: what cannot be
read is not taken to be no match.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Annotated, Literal

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecution, WorkflowQueryFailedError
from temporalio.service import RPCError

from autoclusters.clients.incidents import IncidentSummary, _status_name, list_incidents
from autoclusters.core.policy import TopologyLevel
from autoclusters.core.settings import Settings
from autoclusters.core.systemic import SYSTEMIC_WORKFLOW, SystemicState
from autoclusters.integrations import temporal
from autoclusters.integrations.temporal import quoted
from autoclusters.workflows.systemic_incident import SystemicIncident

__all__ = [
    "IncidentListing",
    "ListedIncident",
    "SystemicMemberRow",
    "SystemicSummary",
    "UnknownHalf",
    "list_all_incidents",
    "list_systemic",
]

# The systemic incidents' status queries, all of them together (a closed one is replayed
# by a worker to answer): a row not answered by then is unknown, and the list stays within
# the API's own bound on a read (api_temporal_timeout_s, 10 s).
QUERIES_WITHIN_S = 5.0
# At most this many status queries at once (a long history of closed systemic incidents).
QUERY_CONCURRENCY = 16
# At most this many systemic incidents are read (each one a status query): the newest,
# the filters judged on them.
MAX_SCANNED = 1000

UNKNOWN = "unknown"


class SystemicMemberRow(BaseModel):
    node: str
    incident_id: str = ""  # "": known from the guard, not joined yet
    fault: str = ""
    drained: bool = False


class SystemicSummary(BaseModel):
    kind: Literal["systemic"] = "systemic"
    incident_id: str
    level: TopologyLevel | None  # None: unknown (its status query failed)
    domain: str
    workflow_id: str
    status: str  # Temporal's: running, completed, failed, ...
    state: str  # the systemic incident's own: open, resolved, handed_off, ...; or unknown
    members: list[SystemicMemberRow] | None  # None: unknown (its status query failed)
    started_at: datetime | None
    closed_at: datetime | None


ListedIncident = Annotated[IncidentSummary | SystemicSummary, Field(discriminator="kind")]


class UnknownHalf(BaseModel):
    """A half of the list that could not be read: its rows are unknown, not absent."""

    kind: Literal["node", "systemic"]
    reason: str


class IncidentListing(BaseModel):
    incidents: list[ListedIncident]
    unknown: list[UnknownHalf] = Field(default_factory=list)


def _summary(wf: WorkflowExecution, state: SystemicState | None) -> SystemicSummary:
    sa = wf.typed_search_attributes
    incident_id = sa.get(temporal.INCIDENT_ID) or "?"
    if state is None:
        return SystemicSummary(
            incident_id=incident_id, level=None, domain=sa.get(temporal.NODE) or "?",
            workflow_id=wf.id, status=_status_name(wf.status), state=UNKNOWN, members=None,
            started_at=wf.start_time, closed_at=wf.close_time,
        )  # fmt: skip
    members = [
        SystemicMemberRow(node=m.node, incident_id=m.incident_id, fault=m.fault, drained=m.drained)
        for m in state.members
    ]
    return SystemicSummary(
        incident_id=incident_id, level=state.request.level, domain=state.request.domain,
        workflow_id=wf.id, status=_status_name(wf.status), state=state.status, members=members,
        started_at=state.request.opened_at, closed_at=state.closed_at or wf.close_time,
    )  # fmt: skip


def _matches(row: SystemicSummary, state: str | None, node: str | None, fault: str | None) -> bool:
    """Does the row pass the filters? A row whose state or members are unknown does."""
    if state and row.state not in (state, UNKNOWN):
        return False
    if row.members is None:
        return True
    if node and all(m.node != node for m in row.members):
        return False
    return not fault or any(m.fault == fault for m in row.members)


async def list_systemic(
    client: Client,
    settings: Settings,
    state: str | None = None,
    node: str | None = None,
    fault: str | None = None,
    limit: int | None = None,
) -> list[SystemicSummary]:
    """The cluster's systemic incidents (open and closed), newest first, filtered as the
    module says. `limit`: at most that many."""
    query = f"WorkflowType = '{SYSTEMIC_WORKFLOW}' AND Cluster = {quoted(settings.cluster)}"
    filtered = bool(state or node or fault)
    scan = MAX_SCANNED if filtered or limit is None else min(limit, MAX_SCANNED)
    found = [wf async for wf in client.list_workflows(query, limit=scan)]
    slots = asyncio.Semaphore(QUERY_CONCURRENCY)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUERIES_WITHIN_S

    async def read(wf: WorkflowExecution) -> SystemicSummary:
        handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
        async with slots:
            left = deadline - loop.time()
            if left <= 0:
                return _summary(wf, None)
            try:
                got: SystemicState = await handle.query(
                    SystemicIncident.status, rpc_timeout=timedelta(seconds=left)
                )
            except (RPCError, WorkflowQueryFailedError):
                return _summary(wf, None)
        return _summary(wf, got)

    rows = [r for r in await asyncio.gather(*map(read, found)) if _matches(r, state, node, fault)]
    rows.sort(key=_newest_first)
    return rows[:limit] if limit is not None else rows


def _newest_first(row: IncidentSummary | SystemicSummary) -> tuple[bool, float]:
    started = row.started_at
    return (started is None, -started.timestamp() if started else 0.0)


def _unknown(kind: Literal["node", "systemic"], error: BaseException) -> UnknownHalf:
    if not isinstance(error, Exception):
        raise error  # a cancellation, an interrupt: not a failed read
    return UnknownHalf(kind=kind, reason=f"{type(error).__name__}: {error}"[:500])


async def list_all_incidents(
    client: Client,
    settings: Settings,
    state: str | None = None,
    node: str | None = None,
    fault: str | None = None,
    limit: int | None = None,
) -> IncidentListing:
    """Both halves, newest first, at most `limit` rows in all; a half that fails is named
    in `unknown`. Both failing: the node half's error is raised (Temporal is away)."""
    nodes, systemic = await asyncio.gather(
        list_incidents(client, settings, state, node, fault, limit=limit),
        list_systemic(client, settings, state, node, fault, limit=limit),
        return_exceptions=True,
    )
    if isinstance(nodes, BaseException) and isinstance(systemic, BaseException):
        raise nodes
    rows: list[IncidentSummary | SystemicSummary] = []
    unknown: list[UnknownHalf] = []
    if isinstance(nodes, BaseException):
        unknown.append(_unknown("node", nodes))
    else:
        rows.extend(nodes)
    if isinstance(systemic, BaseException):
        unknown.append(_unknown("systemic", systemic))
    else:
        rows.extend(systemic)
    rows.sort(key=_newest_first)
    return IncidentListing(incidents=rows[:limit] if limit is not None else rows, unknown=unknown)
