"""How each rung of the ladder has fared for each fault kind: the figures an incident is
opened with when its policy skips rungs that rarely work (`skip_rung_below`).

Kept apart from the code that computes them (core/ladder.py) because the policy snapshot
carries them: core/policy.py imports this module, and this one imports nothing of ours.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

# A cluster's history has a few dozen (fault, rung) pairs; the cap keeps a snapshot small
# inside every incident's input however long the history.
MAX_ROWS = 1000


class RungFigures(BaseModel):
    """One (fault kind, rung): how often it was tried and how often it held."""

    model_config = ConfigDict(extra="forbid")

    fault: str = Field(max_length=64)
    rung: str = Field(pattern=r"^(reset_gpu|reboot|replace)$")
    attempts: int = Field(ge=0)
    # The node passed its health gate after this repair and had no new incident within the
    # recurrence window.
    successes: int = Field(ge=0)
    # Median seconds from the incident's start to the node back in service, over the
    # successes that returned it (None: none did).
    median_capacity_s: float | None = Field(default=None, ge=0)

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.attempts if self.attempts else None


class LadderFigures(BaseModel):
    """Every (fault, rung) seen in the cluster's incidents, as of `as_of`."""

    model_config = ConfigDict(extra="forbid")

    as_of: datetime | None = None
    incidents: int = Field(default=0, ge=0)  # incidents read to compute them
    rows: list[RungFigures] = Field(default_factory=list, max_length=MAX_ROWS)

    def of(self, fault: str, rung: str) -> RungFigures | None:
        return next((r for r in self.rows if r.fault == fault and r.rung == rung), None)
