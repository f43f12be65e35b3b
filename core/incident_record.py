"""An incident as its history tells it: what the live policy decided at each point and how
each repair turned out. Built from a NodeRemediation history (clients/incident_history.py)
and read by the policy replay (core/policy_replay.py) and the ladder's figures
(core/ladder.py), which never see Temporal.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from autoclusters.core.policy import Policy, Rung
from autoclusters.core.recovery_loss import RecoveryLoss


class RepairAttempt(BaseModel):
    rung: Rung
    at: datetime  # when the repair started
    # The health gate's verdict after it; None: no verdict (the incident ended first).
    # A repair that itself failed is False: the node was not fixed by it.
    passed: bool | None = None
    # The repair itself failed (the cloud refused, it timed out): the incident ended there
    # with the node drained, without climbing.
    repair_failed: bool = False


class Admission(BaseModel):
    kind: str  # quarantine or repair
    admitted: bool
    reason: str = ""
    at: datetime


class IncidentRecord(BaseModel):
    incident_id: str
    cluster: str
    node: str
    fault: str  # the fault that opened it
    faults: list[str] = Field(default_factory=list)  # every fault kind it took in, first first
    started_at: datetime  # when the incident's workflow started
    closed_at: datetime | None = None
    # The incident's own end: resolved, failed, rejected, observed, monitored, cancelled;
    # open while it runs.
    status: str = "open"
    policy: Policy = Field(default_factory=Policy)  # the snapshot it was opened under
    rung: str | None = None  # the rung chosen when it opened (None: it never got that far)
    recent_on_node: int | None = None  # earlier incidents on the node, as the guard counted
    breaker_tripped: bool = False
    approvals_asked: list[str] = Field(default_factory=list)  # the rungs a human was asked for
    decisions: list[tuple[str, bool]] = Field(default_factory=list)  # (step, approved)
    admissions: list[Admission] = Field(default_factory=list)
    repairs: list[RepairAttempt] = Field(default_factory=list)
    # Screened before any repair (a silent fault's rule says `screen_before_repair`): a node
    # that passed went back unrepaired, and the incident still counts in its lemon record.
    screened_before_repair: bool = False
    # That screen's verdict (None: no verdict: it never ended, or was not run).
    screen_passed: bool | None = None
    skipped: list[str] = Field(default_factory=list)  # rungs the live ladder skipped, and why
    returned_at: datetime | None = None  # the node (or its spare) back in service
    # Each planned job's measured loss beside the planner's estimate (policy
    # measure_recovery; core/recovery_loss.py): what `autoclusters stats recovery` and the
    # console's fleet page judge the estimates by.
    recovery_losses: list[RecoveryLoss] = Field(default_factory=list)
    # A member of a systemic incident (docs/systemic.md): its id, and the verdict it told
    # the member (returned, screen_failed, fixed, declined, failed; None: none came).
    systemic: str | None = None
    systemic_verdict: str | None = None

    @property
    def held(self) -> bool:
        """Did the fleet guard hold a quarantine or repair of it at least once?"""
        return any(not a.admitted for a in self.admissions)

    @property
    def first_repair_at(self) -> datetime | None:
        return self.repairs[0].at if self.repairs else None
