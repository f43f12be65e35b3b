"""A systemic incident: faults that cluster in the topology (the nodes of one InfiniBand
leaf, one NVLink domain, one rack) within a window, handled as one incident that owns its
members (docs/systemic.md).

The fleet guard decides who is a member (it sees every incident open); the members'
NodeRemediation incidents join the systemic incident (`join`, through an activity: an
update-with-start, so the first member starts it), park drained with no repair of their
own, and act on the verdict it signals them (`systemic_verdict`) once the provider
answered and the members were screened together.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from autoclusters.core.evidence import HealthSnapshot
from autoclusters.core.guard import GuardContext
from autoclusters.core.handoff_answer import HandoffRecord
from autoclusters.core.models import FaultSeen, ScreenResult, StepRecord, Waiting
from autoclusters.core.policy import Policy, TopologyLevel
from autoclusters.core.systemic_member import (
    SYSTEMIC_MEMBER_SIGNAL,
    SYSTEMIC_VERDICT_SIGNAL,
    Membership,
    SystemicVerdict,
    VerdictKind,
    systemic_incident_id,
    systemic_workflow_id,
)

SYSTEMIC_WORKFLOW = "SystemicIncident"


class MemberJoin(BaseModel):
    """A member incident joining (or reporting again to) its systemic incident."""

    node: str
    incident_id: str
    workflow_id: str
    fault: str
    drained: bool = False  # quarantined: drained, its jobs requeued, idle
    faults: list[FaultSeen] = Field(default_factory=list)
    readings: list[HealthSnapshot] = Field(default_factory=list)
    # A repair of its own that had already started when it learnt it was a member (it
    # ran to its end; the member parks after it).
    repaired: str | None = None
    kubernetes: bool = False  # its Node is cordoned (Slinky): uncordoned for the screen


class JoinCall(BaseModel):
    """The `systemic_join` activity's input: the join, and what the systemic incident
    starts with when it is not running yet."""

    start: SystemicRequest
    join: MemberJoin


class JoinAck(BaseModel):
    incident_id: str
    members: list[str]


class CloseSystemicCall(BaseModel):
    guard: GuardContext
    incident_id: str


class SystemicRequest(BaseModel):
    incident_id: str
    cluster: str
    level: TopologyLevel
    domain: str
    opened_at: datetime
    nodes: list[str] = Field(default_factory=list)  # the members the guard knew at open
    policy: Policy = Field(default_factory=Policy)
    guard: GuardContext
    # Test only: the workflow ids members are told at (None: remediation-<cluster>-<node>).
    member_workflows: dict[str, str] = Field(default_factory=dict)


class SystemicMember(BaseModel):
    node: str
    incident_id: str = ""
    workflow_id: str = ""
    fault: str = ""
    joined_at: datetime | None = None  # None: known from the guard, not joined yet
    drained: bool = False
    repaired: str | None = None
    kubernetes: bool = False
    faults: list[FaultSeen] = Field(default_factory=list)
    readings: list[HealthSnapshot] = Field(default_factory=list)
    screened: bool | None = None  # None: not screened with the others
    verdict: VerdictKind | None = None
    detail: str = ""


SystemicStatus = Literal["open", "resolved", "handed_off", "failed", "cancelled"]


class SystemicState(BaseModel):
    request: SystemicRequest
    status: SystemicStatus = "open"
    current_step: str | None = None
    members: list[SystemicMember] = Field(default_factory=list)
    steps: list[StepRecord] = Field(default_factory=list)
    waiting_for: Waiting | None = None
    handoff: HandoffRecord | None = None
    screens: list[ScreenResult] = Field(default_factory=list)
    error: str | None = None
    closed_at: datetime | None = None

    def member(self, node: str) -> SystemicMember | None:
        return next((m for m in self.members if m.node == node), None)


JoinCall.model_rebuild()

__all__ = [
    "SYSTEMIC_MEMBER_SIGNAL",
    "SYSTEMIC_VERDICT_SIGNAL",
    "CloseSystemicCall",
    "JoinAck",
    "JoinCall",
    "MemberJoin",
    "Membership",
    "SystemicMember",
    "SystemicRequest",
    "SystemicState",
    "SystemicVerdict",
    "VerdictKind",
    "systemic_incident_id",
    "systemic_workflow_id",
]
