"""What a member incident knows of its systemic incident (docs/systemic.md): its place,
as the fleet guard decided it, and the verdict the systemic incident told it. Apart from
core/systemic.py so that the incident's state (core/models.py) can hold them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from autoclusters.core.policy import TopologyLevel

# The guard tells a member it belongs to a systemic incident; the systemic incident tells
# each member what became of it.
SYSTEMIC_MEMBER_SIGNAL = "systemic_member"
SYSTEMIC_VERDICT_SIGNAL = "systemic_verdict"


def systemic_workflow_id(cluster: str, level: TopologyLevel, domain: str) -> str:
    """One open systemic incident per domain: a later one on the same leaf reuses the id."""
    return f"systemic-{cluster}-{level}-{domain}"


def systemic_incident_id(domain: str, at: datetime) -> str:
    """Shaped as the API's incident ids (inc-YYYYMMDD-HHMMSS-<name>), so the hand-off's
    answer route finds it."""
    return f"inc-{at.strftime('%Y%m%d-%H%M%S')}-{domain}"


class Membership(BaseModel):
    """A node's place in a systemic incident, as the fleet guard decided it."""

    incident_id: str  # the systemic incident's
    workflow_id: str
    level: TopologyLevel
    domain: str
    opened_at: datetime
    nodes: list[str] = Field(default_factory=list)  # the members the guard knew then


VerdictKind = Literal["returned", "screen_failed", "fixed", "declined", "failed"]


class SystemicVerdict(BaseModel):
    """What the systemic incident tells a member: `returned` (passed the screen with the
    others: back to service), `screen_failed` (its own incident from here: the ladder),
    `fixed` (the fabric is fixed, the member was not screened with the others: it screens
    itself first), `declined` (the provider declined: left drained), `failed` (the
    systemic incident failed: left drained for a human)."""

    incident_id: str  # the systemic incident's
    verdict: VerdictKind
    detail: str = ""
