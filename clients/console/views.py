"""The incident pages' models: an incident's timeline as a person reads it, and the feed
of notifications sent.

Notifications are recorded where the runbook records everything: each one is a
`notify_<event>` step on the incident's timeline (workflows/incident.py `Incident.notify`), with
its outcome (sent, or failed after retries) and time.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from autoclusters.clients.incidents import IncidentSummary
from autoclusters.core.models import (
    ApprovalRecord,
    FaultSeen,
    IncidentState,
    JobRecord,
    RefusedApproval,
    StepRecord,
)
from autoclusters.core.recovery_cost import RecoveryPlan
from autoclusters.core.recovery_loss import RecoveryLoss

NOTIFY_PREFIX = "notify_"


class StepRow(BaseModel):
    name: str
    started_at: datetime
    finished_at: datetime | None
    duration: str  # "1.2 s", "running"
    outcome: str
    detail: str


def step_rows(steps: list[StepRecord], now: datetime) -> list[StepRow]:
    """A workflow's timeline as the console shows it (an incident's, a systemic one's)."""
    return [
        StepRow(
            name=s.name,
            started_at=s.started_at,
            finished_at=s.finished_at,
            duration=duration(s, now),
            outcome=s.outcome,
            detail=s.detail,
        )
        for s in steps
    ]


class NotificationRow(BaseModel):
    at: datetime
    incident_id: str
    node: str
    fault: str
    event: str
    outcome: str  # ok: sent to every notifier; failed; running
    detail: str = ""


class IncidentPage(BaseModel):
    incident_id: str
    workflow_id: str
    temporal_status: str
    temporal_url: str
    slack_url: str | None = None
    slack_thread: str | None = None  # channel/ts, when there is no web link for it
    node: str
    fault: str
    status: str
    mode: str
    rung: str | None
    current_step: str | None
    waiting: str = ""
    opened_at: datetime
    opened_by: str
    closed_at: datetime | None
    error: str | None
    steps: list[StepRow]
    faults: list[FaultSeen]
    approvals: list[ApprovalRecord]
    refusals: list[RefusedApproval]
    notifications: list[NotificationRow]
    # Jobs the incident requeued that a restarted Slurm controller no longer knows.
    vanished_jobs: list[JobRecord] = Field(default_factory=list)
    # Each job's recovery plan (every path's estimate, the one chosen), the path it took,
    # and, once the incident closed, its measured loss beside the estimate.
    recovery_plans: list[RecoveryPlan] = Field(default_factory=list)
    recovery_path: dict[int, str] = Field(default_factory=dict)
    recovery_losses: dict[int, RecoveryLoss] = Field(default_factory=dict)


class IncidentsPage(BaseModel):
    open: list[IncidentSummary]
    recent: list[IncidentSummary]
    errors: list[str] = Field(default_factory=list)


class NotificationsPage(BaseModel):
    notifications: list[NotificationRow]
    errors: list[str] = Field(default_factory=list)


def duration(step: StepRecord, now: datetime) -> str:
    end = step.finished_at
    seconds = ((end or now) - step.started_at).total_seconds()
    text = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    return text if end is not None else f"{text} (running)"


def notifications(state: IncidentState) -> list[NotificationRow]:
    req = state.request
    return [
        NotificationRow(
            at=s.started_at,
            incident_id=req.incident_id,
            node=req.node,
            fault=req.fault,
            event=s.name.removeprefix(NOTIFY_PREFIX),
            outcome=s.outcome,
            detail=s.detail,
        )
        for s in state.steps
        if s.name.startswith(NOTIFY_PREFIX)
    ]


def incident_page(
    state: IncidentState,
    *,
    workflow_id: str,
    temporal_status: str,
    temporal_url: str,
    now: datetime,
    slack_url: str | None = None,
    slack_thread: str | None = None,
) -> IncidentPage:
    req = state.request
    w = state.waiting_for
    return IncidentPage(
        incident_id=req.incident_id,
        workflow_id=workflow_id,
        temporal_status=temporal_status,
        temporal_url=temporal_url,
        slack_url=slack_url,
        slack_thread=slack_thread,
        node=req.node,
        fault=req.fault,
        status=state.status,
        mode=state.mode,
        rung=state.rung,
        current_step=state.current_step,
        waiting=f"{w.kind}{' of ' + w.step if w.step else ''}: {w.detail}" if w else "",
        opened_at=req.opened_at,
        opened_by=req.opened_by,
        closed_at=state.closed_at,
        error=state.error,
        steps=step_rows(state.steps, now),
        faults=state.faults,
        approvals=state.approvals,
        refusals=state.refusals,
        notifications=notifications(state),
        vanished_jobs=state.vanished_jobs,
        recovery_plans=state.recovery_plans,
        recovery_path=state.recovery_path,
        recovery_losses={x.job_id: x for x in state.recovery_losses},
    )


def feed(states: list[IncidentState], limit: int = 200) -> list[NotificationRow]:
    rows = [n for s in states for n in notifications(s)]
    return sorted(rows, key=lambda n: n.at, reverse=True)[:limit]
