"""When a fault's cost to a job begins: the fault's start as its source saw it, not the
incident's opening (issue 42; core/recovery_cost.py estimates from it, core/recovery_loss.py
measures from it).

A job stops making progress at the fault. The runbook hears of it later: the node's agent
reads the Xid some 0.1-0.4 s after it (a tenth to a third of an in-job recovery), an alert
arrives a scrape later. Counted from the opening, the measured seconds to stepping again
leave that detection out, and figures taken from them estimate the next fault low by as
much; the work since the checkpoint, counted to the opening, is long by as much. So both
the plan and the measurement count from the fault's start: the earliest time its source
said it saw it start (`FaultSeen.first_at`: the agent's reading, an alert's `startsAt`).

A source that saw it start long before the incident opened (an alert firing for an hour on
a degraded GPU the job ran through) speaks of a condition, not of the moment the job
stopped: beyond DETECTION_MAX_S the opening stands, as it does when no source said.
"""

from __future__ import annotations

from datetime import UTC, datetime

# Longer than any detection path (an agent's poll, a scrape and an alert's group wait),
# shorter than a condition a job runs through.
DETECTION_MAX_S = 60.0


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def loss_starts(opened_at: datetime, first_seen: datetime | None) -> datetime:
    """The moment the job's loss is counted from: `first_seen` (the fault's start as its
    source saw it) where it is before the opening by at most DETECTION_MAX_S, else the
    opening."""
    opened = _utc(opened_at)
    if first_seen is None:
        return opened
    seen = _utc(first_seen)
    if seen >= opened or (opened - seen).total_seconds() > DETECTION_MAX_S:
        return opened
    return seen
