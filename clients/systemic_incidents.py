"""Reading systemic incidents (docs/systemic.md) for people: the operations behind
`autoclusters incident show <systemic id>` and the console's systemic pages. Read-only:
the state is the SystemicIncident's own `status` query, as the Temporal UI shows it.

A systemic incident's id is shaped as a node's (`inc-YYYYMMDD-HHMMSS-<its domain>`), so
`incidents.find_incident` finds both; `systemic_read` says which one it found.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from autoclusters.core.handoff_answer import HandoffRecord
from autoclusters.core.models import Waiting
from autoclusters.core.settings import Settings
from autoclusters.core.systemic import SYSTEMIC_WORKFLOW, SystemicMember, SystemicState
from autoclusters.integrations.temporal import quoted
from autoclusters.workflows.systemic_incident import SystemicIncident

QUERY_TIMEOUT = timedelta(seconds=5)


class SystemicRead(BaseModel):
    state: SystemicState
    workflow_id: str
    temporal_status: str


async def systemic_read(handle: WorkflowHandle) -> SystemicRead | None:
    """The systemic incident's state, when `handle` is one (None: a node's incident)."""
    desc = await handle.describe()
    if desc.workflow_type != SYSTEMIC_WORKFLOW:
        return None
    state = await handle.query(SystemicIncident.status, rpc_timeout=QUERY_TIMEOUT)
    status = desc.status.name.lower() if desc.status else "unknown"
    return SystemicRead(state=state, workflow_id=desc.id, temporal_status=status)


async def open_systemic(client: Client, settings: Settings) -> list[SystemicState]:
    """The cluster's running systemic incidents, newest first (one that closes or whose
    worker does not answer meanwhile is left out until the next read)."""
    query = (
        f"WorkflowType = '{SYSTEMIC_WORKFLOW}' AND ExecutionStatus = 'Running' AND Cluster = "
        + quoted(settings.cluster)
    )

    async def read(wf_id: str, run_id: str | None) -> SystemicState | None:
        handle = client.get_workflow_handle(wf_id, run_id=run_id)
        try:
            state: SystemicState = await handle.query(
                SystemicIncident.status, rpc_timeout=QUERY_TIMEOUT
            )
        except RPCError:
            return None
        return state

    found = [read(wf.id, wf.run_id) async for wf in client.list_workflows(query)]
    states = [s for s in await asyncio.gather(*found) if s is not None]
    return sorted(states, key=lambda s: s.request.opened_at, reverse=True)


def handoff_text(handoff: HandoffRecord | None, waiting: Waiting | None) -> str:
    """Where the hand-off to the provider stands, in one line."""
    if handoff is None:
        return "not handed off yet"
    if handoff.answer is not None:
        when = f" at {handoff.answered_at:%Y-%m-%d %H:%M:%S} UTC" if handoff.answered_at else ""
        note = f": {handoff.note}" if handoff.note else ""
        return f"answered {handoff.answer}{when}{note}"
    if handoff.sent_at is None:
        return f"sending ({handoff.reason}) since {handoff.started_at:%Y-%m-%d %H:%M:%S} UTC"
    ticket = f", ticket {handoff.ticket}" if handoff.ticket else ""
    text = f"sent {handoff.sent_at:%Y-%m-%d %H:%M:%S} UTC{ticket}"
    if waiting is not None and waiting.kind == "handoff":
        text += f", waiting for the provider's answer ({handoff.reminders} reminders)"
    return text


def screen_text(member: SystemicMember) -> str:
    """A member's screen with the others: passed, failed, or not (yet) screened."""
    if member.screened is None:
        return "-"
    return "passed" if member.screened else "failed"
