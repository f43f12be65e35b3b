"""The console's systemic incidents (docs/systemic.md): a row per open one on the fleet
page, and a page for one: its domain, its members (each linking to its own incident's
page), the hand-off to the provider, its steps. Built from the SystemicIncident's own
`status` query (clients/systemic_incidents.py), the same facts the CLI shows.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from autoclusters.clients.console.views import StepRow, step_rows
from autoclusters.clients.systemic_incidents import SystemicRead, handoff_text, screen_text
from autoclusters.core.systemic import SystemicState


class SystemicSummary(BaseModel):
    """One open systemic incident, as the fleet page lists it."""

    incident_id: str
    level: str
    domain: str
    status: str
    opened_at: datetime
    members: int
    drained: int
    current_step: str | None
    handoff: str


class MemberRow(BaseModel):
    node: str
    incident_id: str  # "": known to the guard, not joined yet
    drained: bool
    screen: str  # passed, failed, "-": not screened with the others
    verdict: str
    detail: str


class SystemicPage(BaseModel):
    incident_id: str
    workflow_id: str
    temporal_status: str
    temporal_url: str
    level: str
    domain: str
    status: str
    current_step: str | None
    waiting: str
    opened_at: datetime
    closed_at: datetime | None
    error: str | None
    handoff: str
    members: list[MemberRow]
    steps: list[StepRow]


def summary(state: SystemicState) -> SystemicSummary:
    r = state.request
    return SystemicSummary(
        incident_id=r.incident_id,
        level=r.level,
        domain=r.domain,
        status=state.status,
        opened_at=r.opened_at,
        members=len(state.members),
        drained=sum(m.drained for m in state.members),
        current_step=state.current_step,
        handoff=handoff_text(state.handoff, state.waiting_for),
    )


def page(read: SystemicRead, *, temporal_url: str, now: datetime) -> SystemicPage:
    state, r, w = read.state, read.state.request, read.state.waiting_for
    return SystemicPage(
        incident_id=r.incident_id,
        workflow_id=read.workflow_id,
        temporal_status=read.temporal_status,
        temporal_url=temporal_url,
        level=r.level,
        domain=r.domain,
        status=state.status,
        current_step=state.current_step,
        waiting=f"{w.kind}{' of ' + w.step if w.step else ''}: {w.detail}" if w else "",
        opened_at=r.opened_at,
        closed_at=state.closed_at,
        error=state.error,
        handoff=handoff_text(state.handoff, w),
        members=[
            MemberRow(
                node=m.node,
                incident_id=m.incident_id,
                drained=m.drained,
                screen=screen_text(m),
                verdict=m.verdict or "",
                detail=m.detail,
            )
            for m in state.members
        ],
        steps=step_rows(state.steps, now),
    )
