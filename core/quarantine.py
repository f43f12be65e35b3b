"""Is the node still quarantined? The check the runbook makes right before a reboot or a
replacement, after every wait (approval, fleet guard admission) during which a human or a
tool may have undrained the node and Slurm may have scheduled a job on it."""

from __future__ import annotations

from pydantic import BaseModel, Field


class VerifyQuarantineInput(BaseModel):
    node: str
    incident_id: str
    # Drain reasons that hold the node for this incident: ours, and a drain that was already
    # there when the incident quarantined the node (kept, never overwritten).
    reasons: list[str]


class QuarantineStatus(BaseModel):
    node: str
    state: str  # as an operator reads it, e.g. MIXED+DRAIN
    drained: bool
    reason: str  # the node's drain reason now
    ours: bool  # drained under one of the input's reasons
    busy_jobs: list[int] = Field(default_factory=list)  # jobs with processes on the node

    @property
    def intact(self) -> bool:
        """Still out of the scheduler's reach under this incident, and running nothing."""
        return self.drained and self.ours and not self.busy_jobs

    @property
    def restorable(self) -> bool:
        """We may quarantine it again: undrained, or still drained by us (a drain someone
        else made since is theirs: we neither overwrite it nor repair under it)."""
        return not self.drained or self.ours

    def describe(self) -> str:
        parts = [self.state]
        if self.drained:
            parts.append(f"reason {self.reason!r}")
        if self.busy_jobs:
            parts.append(f"running jobs {self.busy_jobs}")
        return ", ".join(parts)
