"""An outcome-driven ladder: how each rung has fared per fault kind, from the cluster's
incident records, and the policy's `skip_rung_below` applied to a rung about to be chosen.

A repair succeeded when the node passed its health gate after it and had no new incident
within the recurrence window of its policy. Time to capacity runs from the incident's start
to the node back in service. Pure functions: the workflow calls `choose_rung` and `climb`
with the figures its policy snapshot carries; the CLI and the replay call `figures_from`.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from autoclusters.core.incident_record import IncidentRecord
from autoclusters.core.ladder_figures import MAX_ROWS, LadderFigures, RungFigures
from autoclusters.core.policy import LADDER, Policy, Rung, next_rung


def _starts_by_node(records: Sequence[IncidentRecord]) -> dict[tuple[str, str], list[datetime]]:
    starts: dict[tuple[str, str], list[datetime]] = {}
    for r in records:
        starts.setdefault((r.cluster, r.node), []).append(r.started_at)
    for times in starts.values():
        times.sort()
    return starts


def _recurred(
    rec: IncidentRecord, starts: dict[tuple[str, str], list[datetime]], as_of: datetime
) -> bool:
    """A later incident on the same node within the record's recurrence window (counted
    from its close), started by `as_of`."""
    times = starts.get((rec.cluster, rec.node), [])
    later = times[bisect.bisect_right(times, rec.started_at) :]
    since = rec.closed_at or rec.started_at
    window = rec.policy.recurrence_window_s
    return any(t <= as_of and (t - since).total_seconds() <= window for t in later[:1])


def figures_from(records: Sequence[IncidentRecord], as_of: datetime | None = None) -> LadderFigures:
    """Per (fault, rung) attempts, successes and median time to capacity, from the records
    started before `as_of` (None: all of them). A repair with no health gate verdict
    (the incident ended first, or the repair itself failed) is not counted."""
    seen = [r for r in records if as_of is None or r.started_at < as_of]
    now = as_of or max((r.closed_at or r.started_at for r in seen), default=None)
    tally: dict[tuple[str, str], tuple[int, int, list[float]]] = {}
    starts = _starts_by_node(seen)
    for rec in seen:
        recurred = now is not None and _recurred(rec, starts, now)
        for attempt in rec.repairs:
            # No verdict, or the repair itself failed: nothing said about the rung.
            if attempt.passed is None or attempt.repair_failed:
                continue
            key = (rec.fault, attempt.rung.value)
            tries, wins, capacity = tally.get(key, (0, 0, []))
            won = attempt.passed and not recurred
            if won and rec.returned_at is not None:
                capacity.append((rec.returned_at - rec.started_at).total_seconds())
            tally[key] = (tries + 1, wins + int(won), capacity)
    rows = [
        RungFigures(
            fault=fault,
            rung=rung,
            attempts=tries,
            successes=wins,
            median_capacity_s=statistics.median(capacity) if capacity else None,
        )
        for (fault, rung), (tries, wins, capacity) in sorted(
            tally.items(), key=lambda kv: (kv[0][0], LADDER.index(Rung(kv[0][1])))
        )
    ]
    return LadderFigures(as_of=now, incidents=len(seen), rows=rows[:MAX_ROWS])


def skip_reason(policy: Policy, fault: str, rung: Rung, figures: LadderFigures | None) -> str:
    """Why `rung` is skipped for `fault` under `policy` ("" when it is not)."""
    up = next_rung(rung)
    if figures is None or policy.skip_rung_below <= 0 or rung == Rung.MONITOR or up is None:
        return ""
    row = figures.of(fault, rung.value)
    if row is None or row.attempts < policy.min_samples:
        return ""
    if row.successes / row.attempts >= policy.skip_rung_below:
        return ""
    return (
        f"{rung.value} fixed {fault} in {row.successes} of {row.attempts} cases: "
        f"going to {up.value}"
    )


@dataclass
class RungChoice:
    rung: Rung
    skipped: list[str] = field(default_factory=list)  # one line per rung skipped, why


def skip_from(policy: Policy, fault: str, rung: Rung, figures: LadderFigures | None) -> RungChoice:
    """`rung`, or the first rung above it that the figures do not rule out for `fault`."""
    choice = RungChoice(rung)
    while why := skip_reason(policy, fault, choice.rung, figures):
        choice.skipped.append(why)
        choice.rung = next_rung(choice.rung) or choice.rung
    return choice


def choose_rung(policy: Policy, faults: Sequence[str], recent: int) -> RungChoice:
    """The rung an incident with these faults opens on: the worst of each fault's rung (one
    up per earlier incident on the node), each past the rungs its figures rule out."""
    choices = [skip_from(policy, f, policy.rung_for(f, recent), policy.ladder) for f in faults]
    return max(choices, key=lambda c: LADDER.index(c.rung))


def climb(policy: Policy, fault: str, failed: Rung) -> RungChoice | None:
    """The rung after `failed` failed its health gate (None: the ladder ends)."""
    up = next_rung(failed)
    return None if up is None else skip_from(policy, fault, up, policy.ladder)
