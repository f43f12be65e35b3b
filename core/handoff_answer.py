"""The provider's answer to a hand-off, and the hand-off as the incident keeps it
(core/handoff.py has the rest: the request, the signing). Apart so that the incident's
state (core/models.py) can hold the record without importing the bundle it is built from.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Why automation stopped: the ladder's last repair failed its gate; a lemon node passed
# its gate (the provider looks at a machine repaired too often); a fault the policy says
# only the provider can fix (a fabric fault: no reboot or replacement of ours fixes it).
HandoffReason = Literal["health_gate_failed", "lemon", "provider_fault"]
AnswerKind = Literal["fixed", "replaced", "declined"]


class HandoffAnswer(BaseModel):
    """The provider's answer, `POST /v1/handoffs/{incident_id}/answer`."""

    model_config = ConfigDict(extra="forbid")

    answer: AnswerKind
    ticket: str = Field(default="", max_length=200)
    note: str = Field(default="", max_length=2000)
    # replaced: the new machine's id, when the provider knows it (shown, never trusted).
    new_vm_id: str | None = Field(default=None, max_length=200)


class HandoffRecord(BaseModel):
    """The hand-off on the incident: what went, what came back."""

    reason: HandoffReason
    summary: str
    started_at: datetime
    sent_at: datetime | None = None
    accepted_at: float | None = None  # epoch seconds, the worker's clock (HandoffSent)
    ticket: str = ""
    answer: AnswerKind | None = None
    answered_at: datetime | None = None
    note: str = ""
    new_vm_id: str | None = None
    reminders: int = 0
