"""Policy replay: what a candidate policy would have done in each incident already handled,
beside what the live policy did. Pure: it reads incident records (core/incident_record.py)
and touches nothing; `autoclusters policy replay` and `policy apply` print its report.

At each decision point the candidate is judged on the incident's own history:
- the rung, through the same choice the runbook makes (core/ladder.py), with the ladder's
  figures as they stood when the incident opened (the incidents before it) when the
  candidate skips rungs; earlier incidents on the node and the breaker are the live
  answers when the candidate's setting is the live one, else recounted from the incidents
  read (so a replay over a short `--since` counts fewer);
- approvals: asked when the candidate's mode or step says so; the live decision on that
  rung stands, and a rung nobody decided on is taken as approved (said in the notes);
- the fleet guard: the live answer when the candidate's limits are the live ones, else
  recounted from the incidents repairing and out of service at that moment;
- a fault whose candidate rule screens before repair: the incident's own screen verdict
  (passed: no repair, its outcome as it was; failed: the repairs below), `unknown` where the
  incident was not screened first;
- a member of a systemic incident: with the candidate's systemic incidents on, its verdict
  as it was (returned or declined: no repair of its own); off, repaired on its own below;
- the repairs: a rung the incident tried turns out as it did; one it did not is taken to
  work if a cheaper rung worked and to fail if a dearer one failed; otherwise the outcome is
  `unknown` (a rung that was never tried tells nothing).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, Field

from autoclusters.core.incident_record import IncidentRecord
from autoclusters.core.ladder import choose_rung, climb, figures_from
from autoclusters.core.policy import LADDER, Policy, Rung


class Decisions(BaseModel):
    """What a policy did (or would do) in one incident."""

    rung: str | None  # the rung of the first repair (or the plan, when nothing was repaired)
    skipped: list[str] = Field(default_factory=list)  # rungs the ladder skipped, and why
    approval: list[str] = Field(default_factory=list)  # the rungs a human is asked for
    guard: str = "-"  # held (at least once), admitted, or - (never asked)
    breaker: bool = False  # tripped when the incident opened
    repairs: list[str] = Field(default_factory=list)  # the rungs repaired, in order
    outcome: str = "unknown"  # resolved, failed, rejected, observed, monitored, unknown


class IncidentDiff(BaseModel):
    incident_id: str
    node: str
    fault: str
    started_at: datetime
    live: Decisions
    candidate: Decisions
    changes: list[str] = Field(default_factory=list)  # one line per decision that differs
    notes: list[str] = Field(default_factory=list)  # what the candidate's answer assumed

    @property
    def changed(self) -> bool:
        return bool(self.changes)


class ReplaySummary(BaseModel):
    incidents: int = 0
    changed: int = 0
    repairs_live: int = 0
    repairs_candidate: int = 0
    avoided: dict[str, int] = Field(default_factory=dict)  # rung -> repairs the candidate saves
    added: dict[str, int] = Field(default_factory=dict)  # rung -> repairs it adds
    approvals_live: int = 0
    approvals_candidate: int = 0
    held_live: int = 0
    held_candidate: int = 0
    breaker_live: int = 0
    breaker_candidate: int = 0
    unknown_outcomes: int = 0  # incidents whose candidate outcome history cannot tell


class ReplayReport(BaseModel):
    incidents: list[IncidentDiff] = Field(default_factory=list)
    summary: ReplaySummary = Field(default_factory=ReplaySummary)

    @property
    def changes_outcomes(self) -> bool:
        return self.summary.changed > 0


# --- what the live policy did --------------------------------------------------------------


def live_decisions(rec: IncidentRecord) -> Decisions:
    repairs = [a.rung.value for a in rec.repairs]
    return Decisions(
        rung=repairs[0] if repairs else rec.rung,
        skipped=rec.skipped,
        approval=rec.approvals_asked,
        guard="held" if rec.held else ("admitted" if rec.admissions else "-"),
        breaker=rec.breaker_tripped,
        repairs=repairs,
        outcome=rec.status,
    )


# --- what the candidate would do -----------------------------------------------------------


def _recent(cand: Policy, rec: IncidentRecord, records: Sequence[IncidentRecord]) -> int:
    if cand.recurrence_window_s == rec.policy.recurrence_window_s:
        if rec.recent_on_node is not None:
            return rec.recent_on_node
    return sum(
        1
        for o in records
        if o.cluster == rec.cluster
        and o.node == rec.node
        and 0 < (rec.started_at - o.started_at).total_seconds() <= cand.recurrence_window_s
    )


def _breaker(
    cand: Policy, rec: IncidentRecord, records: Sequence[IncidentRecord], nodes: int
) -> bool:
    g, live = cand.guard, rec.policy.guard
    same = (g.breaker_threshold, g.breaker_threshold_fraction, g.breaker_window_s) == (
        live.breaker_threshold,
        live.breaker_threshold_fraction,
        live.breaker_window_s,
    )
    if same:
        return rec.breaker_tripped
    opens = sum(
        1
        for o in records
        if o.cluster == rec.cluster
        and 0 <= (rec.started_at - o.started_at).total_seconds() < g.breaker_window_s
    )
    return opens > g.breaker_limit(nodes)


def _held(
    cand: Policy,
    rec: IncidentRecord,
    records: Sequence[IncidentRecord],
    nodes: int,
    tripped: bool,
) -> bool:
    g, live = cand.guard, rec.policy.guard
    if tripped:
        return True
    same = (g.max_concurrent_repairs, g.min_in_service_fraction) == (
        live.max_concurrent_repairs,
        live.min_in_service_fraction,
    )
    if same and not rec.breaker_tripped and rec.admissions:
        return rec.held
    at = rec.admissions[0].at if rec.admissions else rec.first_repair_at or rec.started_at
    others = [o for o in records if o.cluster == rec.cluster and o.incident_id != rec.incident_id]

    def during(start: datetime | None, o: IncidentRecord) -> bool:
        end = o.returned_at or o.closed_at
        return start is not None and start <= at and (end is None or at < end)

    repairing = sum(1 for o in others if during(o.first_repair_at, o))
    out = sum(1 for o in others if o.repairs and during(o.started_at, o))
    in_service = 1 - (out + 1) / nodes if nodes else 1.0
    return repairing >= g.max_concurrent_repairs or in_service < g.min_in_service_fraction


def _verdict(rec: IncidentRecord, rung: Rung) -> bool | None:
    """Would `rung` have fixed this incident's node? None: its history cannot tell."""
    known = {a.rung: a.passed for a in rec.repairs if a.passed is not None and not a.repair_failed}
    if rung in known:
        return known[rung]
    i = LADDER.index(rung)
    if any(ok and LADDER.index(r) < i for r, ok in known.items()):
        return True  # a dearer rung fixes what a cheaper one did
    if any(not ok and LADDER.index(r) > i for r, ok in known.items()):
        return False  # a cheaper rung does not fix what a dearer one could not
    return None


def _repairs_from(
    cand: Policy, rec: IncidentRecord, first: Rung, out: Decisions, notes: list[str]
) -> None:
    """The repairs from `first` up, asking approval where the candidate says so."""
    decided = dict(rec.decisions)
    rung: Rung | None = first
    while rung is not None:
        if cand.mode == "approve" or cand.step(rung).needs_approval:
            out.approval.append(rung.value)
            if decided.get(rung.value) is False:
                out.outcome = "rejected"
                return
            if rung.value not in decided:
                notes.append(f"nobody decided on {rung.value} in this incident: taken as approved")
        out.repairs.append(rung.value)
        if any(a.rung == rung and a.repair_failed for a in rec.repairs):
            out.outcome = "failed"  # the repair itself failed: the incident ends there
            return
        verdict = _verdict(rec, rung)
        if verdict is None:
            notes.append(f"{rung.value} was never tried on this incident: its outcome is unknown")
            out.outcome = "unknown"
            return
        if verdict:
            out.outcome = "resolved"
            return
        up = climb(cand, rec.fault, rung)
        if up is None or len(out.repairs) >= cand.max_repair_attempts:
            out.outcome = "failed"
            return
        out.skipped += up.skipped
        rung = up.rung


def candidate_decisions(
    cand: Policy, rec: IncidentRecord, records: Sequence[IncidentRecord], nodes: int
) -> tuple[Decisions, list[str]]:
    notes: list[str] = []
    if cand.skip_rung_below > 0 and cand.ladder is None:
        cand = cand.model_copy(update={"ladder": figures_from(records, as_of=rec.started_at)})
    choice = choose_rung(cand, rec.faults or [rec.fault], _recent(cand, rec, records))
    out = Decisions(rung=choice.rung.value, skipped=list(choice.skipped))
    out.breaker = _breaker(cand, rec, records, nodes)
    if cand.mode == "observe":
        out.outcome = "observed"
        return out, notes
    if choice.rung == Rung.MONITOR:
        out.outcome = "monitored"
        return out, notes
    out.guard = "held" if _held(cand, rec, records, nodes, out.breaker) else "admitted"
    if rec.systemic is not None:
        # A member of a systemic incident: with systemic incidents on, its verdict decided
        # as it did (returned, declined, failed: no repair of its own); without them, it
        # is repaired on its own below (a rung never tried: unknown).
        if cand.guard.systemic.enabled and rec.systemic_verdict in ("returned", "declined"):
            out.outcome = rec.status
            return out, notes
        if not cand.guard.systemic.enabled:
            notes.append(
                f"a member of systemic incident {rec.systemic}: without systemic incidents "
                "it is repaired on its own"
            )
    if cand.rule_for(rec.fault).screen_before_repair:
        # The screen decides between return and repair: its verdict is the incident's own
        # only where the live policy screened first too.
        if rec.screen_passed is None:
            notes.append("the screen before repair was never run on this incident: unknown")
            out.outcome = "unknown"
            return out, notes
        if rec.screen_passed:
            out.outcome = rec.status  # returned unrepaired (or held as a lemon), as it was
            return out, notes
    _repairs_from(cand, rec, choice.rung, out, notes)
    return out, notes


# --- side by side --------------------------------------------------------------------------


def _rungs(rungs: Sequence[str]) -> str:
    return ", ".join(rungs) if rungs else "none"


def _changes(live: Decisions, cand: Decisions) -> list[str]:
    out = []
    if live.rung != cand.rung:
        why = f" ({'; '.join(cand.skipped)})" if cand.skipped else ""
        out.append(f"rung: {live.rung or '-'} -> {cand.rung or '-'}{why}")
    if live.approval != cand.approval:
        out.append(f"approval asked for: {_rungs(live.approval)} -> {_rungs(cand.approval)}")
    if live.guard != cand.guard:
        out.append(f"fleet guard: {live.guard} -> {cand.guard}")
    if live.breaker != cand.breaker:
        trip = {True: "tripped", False: "not tripped"}
        out.append(f"breaker: {trip[live.breaker]} -> {trip[cand.breaker]}")
    if live.repairs != cand.repairs:
        out.append(f"repairs: {_rungs(live.repairs)} -> {_rungs(cand.repairs)}")
    if live.outcome != cand.outcome:
        out.append(f"outcome: {live.outcome} -> {cand.outcome}")
    return out


def replay_policy(
    candidate: Policy, records: Sequence[IncidentRecord], *, cluster_nodes: int | None = None
) -> ReplayReport:
    """Each incident's live decisions beside the candidate's, and what it adds up to.
    `cluster_nodes`: the cluster's size, for the guard's limits when they are recounted
    (None: the nodes the records name, a lower bound)."""
    ordered = sorted(records, key=lambda r: r.started_at)
    nodes = cluster_nodes or len({(r.cluster, r.node) for r in ordered}) or 1
    report = ReplayReport()
    sm = report.summary
    live_rungs: Counter[str] = Counter()
    cand_rungs: Counter[str] = Counter()
    for rec in ordered:
        live = live_decisions(rec)
        cand, notes = candidate_decisions(candidate, rec, ordered, nodes)
        diff = IncidentDiff(
            incident_id=rec.incident_id,
            node=rec.node,
            fault=rec.fault,
            started_at=rec.started_at,
            live=live,
            candidate=cand,
            changes=_changes(live, cand),
            notes=notes,
        )
        report.incidents.append(diff)
        live_rungs.update(live.repairs)
        cand_rungs.update(cand.repairs)
        sm.incidents += 1
        sm.changed += int(diff.changed)
        sm.repairs_live += len(live.repairs)
        sm.repairs_candidate += len(cand.repairs)
        sm.approvals_live += len(live.approval)
        sm.approvals_candidate += len(cand.approval)
        sm.held_live += int(live.guard == "held")
        sm.held_candidate += int(cand.guard == "held")
        sm.breaker_live += int(live.breaker)
        sm.breaker_candidate += int(cand.breaker)
        sm.unknown_outcomes += int(cand.outcome == "unknown")
    sm.avoided = dict(live_rungs - cand_rungs)
    sm.added = dict(cand_rungs - live_rungs)
    return report
