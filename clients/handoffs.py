"""The provider's answer to a hand-off, taken to its incident (docs/handoff.md): the
operation behind `POST /v1/handoffs/{incident_id}/answer`. The caller (the API) has
verified the answer's signature; the incident's `handoff_answer` update checks that it
waits for one."""

from __future__ import annotations

from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from autoclusters.clients import incidents
from autoclusters.core.handoff_answer import HandoffAnswer, HandoffRecord
from autoclusters.core.settings import Settings
from autoclusters.workflows.remediation import NodeRemediation
from autoclusters.workflows.systemic_incident import SystemicIncident


class AnswerRefused(Exception):
    """The incident takes no answer now (none handed off, answered otherwise, closed)."""


async def answer(
    client: Client, settings: Settings, incident_id: str, given: HandoffAnswer
) -> tuple[HandoffRecord, bool]:
    """The hand-off as answered, and whether this answer was a repeat of the one taken
    (a provider that retries after a lost response gets the same record, nothing new).
    IncidentNotFound: no such incident; AnswerRefused: it takes no such answer."""
    handle = await incidents.find_incident(client, settings, incident_id)
    try:
        return await handle.execute_update(NodeRemediation.handoff_answer, given), False
    except (WorkflowUpdateFailedError, RPCError) as e:
        why = str(e.cause) if isinstance(e, WorkflowUpdateFailedError) else e.message
    # A systemic incident (docs/systemic.md) takes answers too, with a state of its own.
    if (await handle.describe()).workflow_type == "SystemicIncident":
        rec = (await handle.query(SystemicIncident.status)).handoff
    else:
        rec = (await handle.query(NodeRemediation.status)).handoff
    if rec is not None and rec.answer == given.answer:
        return rec, True
    raise AnswerRefused(f"incident {incident_id}: {why}")
