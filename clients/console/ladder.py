"""The fleet page's repair ladder: per fault kind and rung, how often the repair was tried
and how often it held, over the history the runbook itself decides with (the figures an
incident opens with, clients/incident_history.py `LadderAtOpen`), and which rungs the live
policy's `skip_rung_below` skips on them, with the reason an incident would give.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from autoclusters.core.ladder import skip_reason
from autoclusters.core.ladder_figures import LadderFigures
from autoclusters.core.policy import Policy, Rung


class LadderRow(BaseModel):
    fault: str
    rung: str
    attempts: int
    successes: int  # passed the health gate, no new incident within the recurrence window
    success_rate: float | None
    median_capacity_s: float | None
    skipped: str  # why the live policy skips this rung for this fault ("" when it does not)


class LadderView(BaseModel):
    as_of: datetime | None
    incidents: int  # incidents read to compute the figures
    history_days: int
    skip_rung_below: float  # the live policy's (0: it skips nothing)
    min_samples: int
    rows: list[LadderRow]


def ladder_view(figures: LadderFigures, policy: Policy, history_days: int) -> LadderView:
    return LadderView(
        as_of=figures.as_of,
        incidents=figures.incidents,
        history_days=history_days,
        skip_rung_below=policy.skip_rung_below,
        min_samples=policy.min_samples,
        rows=[
            LadderRow(
                fault=r.fault,
                rung=r.rung,
                attempts=r.attempts,
                successes=r.successes,
                success_rate=r.success_rate,
                median_capacity_s=r.median_capacity_s,
                skipped=skip_reason(policy, r.fault, Rung(r.rung), figures),
            )
            for r in figures.rows
        ],
    )
