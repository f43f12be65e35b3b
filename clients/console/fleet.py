"""The fleet page's figures over a range of days, read off the incidents' own timelines
(Temporal keeps every incident's steps; a closed one never changes):

- incidents opened per day, by fault;
- time to recovery by fault and rung: the jobs back (requeued and released: free to
  restart elsewhere) and the capacity back (a spare in service, or the node returned),
  as the worker's metrics count them (core/recovery.py), median and p95;
- the share of repairs on each rung whose health gate passed;
- node availability: the node-hours the fleet had, less those its nodes spent out of
  service for an incident (opened -> capacity back; still open: to the range's end);
- the work lost to faults: GPU-hours out of service, and job-hours waiting for the
  requeue (each requeued job, opened -> requeued);
- how good the recovery planner's estimates have been: over the jobs whose loss the
  closed incidents measured, the median and worst |actual - estimate| / actual and how
  many were within ±30 % (core/recovery_loss.py).

The same series the worker exports to Prometheus (deploy/grafana/ has these figures for
Grafana); here they come from the incidents themselves, so the page needs no Prometheus.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from datetime import UTC, date, datetime, timedelta

from pydantic import BaseModel, Field

from autoclusters.clients.console.ladder import LadderView
from autoclusters.clients.console.systemic import SystemicSummary
from autoclusters.core.models import IncidentState
from autoclusters.core.recovery import capacity_recovery, job_recovery
from autoclusters.core.recovery_loss import EstimateQuality, estimate_quality

RANGES: dict[str, int] = {"1d": 1, "7d": 7, "30d": 30}  # days
GATE_STEP = "health_gate"


class RecoveryRow(BaseModel):
    fault: str
    rung: str
    incidents: int
    job_back_p50_s: float | None = None
    job_back_p95_s: float | None = None
    capacity_back_p50_s: float | None = None
    capacity_back_p95_s: float | None = None


class GateRow(BaseModel):
    rung: str
    gated: int  # repairs on this rung that reached the gate
    passed: int

    @property
    def share(self) -> float:
        return self.passed / self.gated if self.gated else 0.0


class FleetView(BaseModel):
    range: str
    start: datetime
    end: datetime
    nodes: int
    gpus_per_node: int
    incidents: int
    days: list[str]  # YYYY-MM-DD, oldest first
    faults: list[str]
    per_day: dict[str, list[int]]  # fault -> incidents opened on each of `days`
    recovery: list[RecoveryRow]
    gates: list[GateRow]
    availability: float | None  # 0..1; None without nodes
    node_hours_out: float
    gpu_hours_lost: float
    job_hours_waiting: float
    # The repair ladder from the incidents' histories (None: it could not be read; the
    # errors say why). Set by the console beside these figures (clients/console/ladder.py).
    ladder: LadderView | None = None
    # The planner's estimates against the losses the closed incidents measured.
    estimates: EstimateQuality = Field(default_factory=EstimateQuality)
    # The open systemic incidents (docs/systemic.md), set by the console beside these
    # figures; `systemic_known` false: they could not be read (the errors say why).
    systemic: list[SystemicSummary] = Field(default_factory=list)
    systemic_known: bool = True
    errors: list[str] = Field(default_factory=list)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 1)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def _back(s: IncidentState, end: datetime) -> datetime:
    """When the incident stopped costing the fleet its node."""
    cap = capacity_recovery(s)
    if cap is not None:
        return s.request.opened_at + timedelta(seconds=cap[0])
    return min(end, s.closed_at) if s.closed_at else end


def figures(
    states: list[IncidentState],
    *,
    span: str,
    now: datetime,
    nodes: int,
    gpus_per_node: int = 8,
    errors: list[str] | None = None,
) -> FleetView:
    if span not in RANGES:
        raise ValueError(f"range: one of {', '.join(RANGES)}, not {span!r}")
    end = now.astimezone(UTC)
    first = end.date() - timedelta(days=RANGES[span] - 1)
    start = datetime(first.year, first.month, first.day, tzinfo=UTC)
    mine = [s for s in states if start <= s.request.opened_at.astimezone(UTC) <= end]
    days = [(first + timedelta(days=i)).isoformat() for i in range(RANGES[span])]
    faults = sorted({s.request.fault for s in mine})
    per_day = {f: [0] * len(days) for f in faults}
    for s in mine:
        day: date = s.request.opened_at.astimezone(UTC).date()
        per_day[s.request.fault][(day - first).days] += 1

    jobs: dict[tuple[str, str], list[float]] = defaultdict(list)
    caps: dict[tuple[str, str], list[float]] = defaultdict(list)
    counted: Counter[tuple[str, str]] = Counter()
    gated: Counter[str] = Counter()
    passed: Counter[str] = Counter()
    out_s = job_wait_s = 0.0
    for s in mine:
        key = (s.request.fault, s.rung or "none")
        counted[key] += 1
        if (j := job_recovery(s)) is not None:
            jobs[key].append(j)
            job_wait_s += j * len(s.requeued_jobs)
        if (c := capacity_recovery(s)) is not None:
            caps[key].append(c[0])
        gate = s.step(GATE_STEP)
        if gate is not None and gate.finished_at is not None:
            gated[s.rung or "none"] += 1
            passed[s.rung or "none"] += gate.outcome == "ok"
        out_s += max(0.0, (_back(s, end) - s.request.opened_at).total_seconds())
    recovery = [
        RecoveryRow(
            fault=fault,
            rung=rung,
            incidents=n,
            job_back_p50_s=_median(jobs[(fault, rung)]),
            job_back_p95_s=_pct(jobs[(fault, rung)], 0.95),
            capacity_back_p50_s=_median(caps[(fault, rung)]),
            capacity_back_p95_s=_pct(caps[(fault, rung)], 0.95),
        )
        for (fault, rung), n in sorted(counted.items())
    ]
    hours = (end - start).total_seconds() / 3600
    node_hours_out = out_s / 3600
    return FleetView(
        range=span,
        start=start,
        end=end,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        incidents=len(mine),
        days=days,
        faults=faults,
        per_day=per_day,
        recovery=recovery,
        gates=[GateRow(rung=r, gated=gated[r], passed=passed[r]) for r in sorted(gated)],
        availability=round(1 - node_hours_out / (nodes * hours), 5) if nodes and hours else None,
        node_hours_out=round(node_hours_out, 2),
        gpu_hours_lost=round(node_hours_out * gpus_per_node, 2),
        job_hours_waiting=round(job_wait_s / 3600, 3),
        estimates=estimate_quality(x for s in mine for x in s.recovery_losses),
        errors=errors or [],
    )
