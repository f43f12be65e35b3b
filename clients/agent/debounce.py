"""Findings over time -> the reports worth sending: fire, re-report, resolve; never a storm.

Per fault kind:

- A finding fires after it has held for `hold_for(fault)` consecutive checks; an immediate
  finding (an event, a lost GPU) fires on the first check that sees it. A fault held in
  seconds (`hold_seconds(fault)`, a link fault) fires on the first check that sees it still
  there `hold_seconds` after the first check of its streak saw it; `due()` says when that
  is, so the agent checks then.
- A check that read only some fault kinds (`only`: the link watch's link check) moves only
  their tracks: one seen starts or continues its streak (and may fire); one not seen ends
  its streak, so a flap shorter than the hold never fires, but never resolves a firing one:
  resolving still counts `clear_checks` periodic checks.
- A check the backend's event asked for (`immediate_only`) fires and re-reports immediate
  findings only, and leaves every other track alone: no streak moves, nothing resolves, so
  holding and clearing still count the periodic checks (`hold_checks` x the interval).
- While it fires it is not reported again, except once every `rereport_s` (a reminder,
  with the next `sequence`), so a lost report or a closed incident gets another chance.
- An immediate finding on a new boot (the machine was rebooted or replaced since it fired)
  is a new fault, not the old one still firing: it is reported at once, with the next
  `sequence`. Without this, an Xid soon after a repair waited for the last boot's to clear
  (`clear_checks` periodic checks) and reached the API only through the alert path.
- A job-progress finding (JOB_HANG, SLOW_NODE) of another job run than the one it fires
  for is a new fault too: reported at once, with the next `sequence`. Such findings are
  never damped: each firing is another run slow or hung on this node (a repeat offender,
  which the lemon record counts), not a sensor flapping; the rules' thresholds are their
  debounce.
- It resolves after `clear_checks` consecutive clean checks: one "resolved" report.
- Up/down/up within the hold never fires; down/up while firing neither resolves nor
  re-fires. A fault that fires for the `max_flaps`-th time within `flap_window_s` is damped:
  it stays firing until it has been clean for a whole `flap_window_s`, so slow flapping
  costs at most `max_flaps` firing and `max_flaps - 1` resolved reports, then one resolved.

The state is a pydantic model so the agent can persist it: after a restart a fault that
was reported stays reported, and one that cleared meanwhile gets its "resolved".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from autoclusters.clients.agent.classify import Finding
from autoclusters.core.node_report import ReportState


class Track(BaseModel):
    present_streak: int = 0
    absent_streak: int = 0
    streak_start: float | None = None
    absent_since: float | None = None
    firing: bool = False
    since: float | None = None  # when the firing period's streak began
    sequence: int = 0
    last_sent: float | None = None
    fired_at: list[float] = Field(default_factory=list)  # firing starts inside the flap window
    damped: bool = False  # fired max_flaps times in the window: resolves only after a clean one
    boot: str | None = None  # the machine's boot id when it (last) fired; None: not known
    episodes: list[str] = Field(default_factory=list)  # the job runs it fired for (if any)
    message: str = ""
    evidence: dict[str, Any] = Field(default_factory=dict)


class DebounceMemory(BaseModel):
    tracks: dict[str, Track] = Field(default_factory=dict)


@dataclass(frozen=True)
class Transition:
    fault: str
    state: ReportState
    since: float
    sequence: int
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)


class Debouncer:
    def __init__(
        self,
        *,
        hold_for: Callable[[str], int],
        hold_seconds: Callable[[str], float | None] = lambda _fault: None,
        clear_checks: int,
        rereport_s: float,
        flap_window_s: float,
        max_flaps: int,
        memory: DebounceMemory | None = None,
    ) -> None:
        self._hold_for = hold_for
        self._hold_s = hold_seconds
        self._clear = clear_checks
        self._rereport = rereport_s
        self._window = flap_window_s
        self._max_flaps = max_flaps
        self.memory = memory or DebounceMemory()
        self._boot: str | None = None  # the boot id of the check being fed

    @property
    def firing(self) -> dict[str, Track]:
        return {k: t for k, t in self.memory.tracks.items() if t.firing}

    def update(
        self,
        now: float,
        findings: dict[str, Finding],
        *,
        immediate_only: bool = False,
        only: frozenset[str] | None = None,
        boot: str | None = None,
    ) -> list[Transition]:
        """Feed one check's findings; returns what to report, in a stable order.
        `immediate_only`: an event's check; only its immediate findings count. `only`: a
        check that read these fault kinds alone (module doc). `boot`: the machine's boot id
        at this check."""
        self._boot = boot
        out: list[Transition] = []
        tracks = self.memory.tracks
        if only is not None:
            for fault in sorted(only & (set(tracks) | set(findings))):
                t = tracks.setdefault(fault, Track())
                t.fired_at = [x for x in t.fired_at if now - x < self._window]
                f = findings.get(fault)
                if f is not None:
                    out += self._present(now, fault, t, f)
                elif not t.firing:  # the streak ends; resolving is the periodic checks'
                    t.present_streak, t.streak_start = 0, None
                    if not t.fired_at:
                        del tracks[fault]
            return out
        if immediate_only:
            for fault in sorted(f for f, x in findings.items() if x.immediate):
                t = tracks.setdefault(fault, Track())
                t.fired_at = [x for x in t.fired_at if now - x < self._window]
                out += self._present(now, fault, t, findings[fault])
            return out
        for fault in sorted(set(tracks) | set(findings)):
            t = tracks.setdefault(fault, Track())
            t.fired_at = [x for x in t.fired_at if now - x < self._window]
            f = findings.get(fault)
            if f is not None:
                out += self._present(now, fault, t, f)
            else:
                out += self._absent(now, fault, t)
                if not t.firing and not t.fired_at and t.present_streak == 0:
                    del tracks[fault]
        return out

    def _present(self, now: float, fault: str, t: Track, f: Finding) -> list[Transition]:
        if t.present_streak == 0:
            # An event began when the backend stamped it, not at the check that read it: the
            # report's `since`, what the runbook counts a job's loss from (core/loss_clock.py).
            started = f.started_at
            t.streak_start = min(now, started) if started is not None else now
        t.present_streak += 1
        t.absent_streak, t.absent_since = 0, None
        t.message, t.evidence = f.message, f.evidence()
        if not t.firing:
            hold_s = None if f.immediate else self._hold_s(fault)
            start = t.streak_start if t.streak_start is not None else now
            if hold_s is not None:
                if now - start < hold_s:
                    return []
            elif t.present_streak < (1 if f.immediate else self._hold_for(fault)):
                return []
            t.firing, t.sequence, t.last_sent, t.boot = True, 0, now, self._boot
            t.since = t.streak_start if t.streak_start is not None else now
            t.fired_at.append(now)
            # A job-progress fault of a new job run each time is a node slow or hung again,
            # for another job: a repeat offender for its lemon record, not a flapping sensor.
            t.damped = len(t.fired_at) >= self._max_flaps and not f.episodes
            t.episodes = list(f.episodes)
            return [self._transition(fault, t, ReportState.FIRING)]
        if f.immediate and self._boot is not None and t.boot not in (None, self._boot):
            # Fired on an earlier boot, seen again on this one: a new fault (module doc).
            t.sequence, t.last_sent, t.since, t.boot = t.sequence + 1, now, now, self._boot
            return [self._transition(fault, t, ReportState.FIRING)]
        if set(f.episodes) - set(t.episodes):
            # Still firing (damped, or not yet clear) for one job run when another shows it:
            # a new fault, reported at once (its incident may be long closed).
            t.sequence, t.last_sent, t.since = t.sequence + 1, now, now
            t.episodes = list(f.episodes)
            t.fired_at.append(now)
            return [self._transition(fault, t, ReportState.FIRING)]
        if t.last_sent is not None and now - t.last_sent >= self._rereport:
            t.sequence += 1
            t.last_sent = now
            return [self._transition(fault, t, ReportState.FIRING)]
        return []

    def due(self) -> float | None:
        """When the first fault held in seconds that is seen but not yet firing has held for
        its hold: a check then fires it if it is still there. None: no such fault."""
        times = [
            t.streak_start + hold_s
            for fault, t in self.memory.tracks.items()
            if not t.firing
            and t.streak_start is not None
            and (hold_s := self._hold_s(fault)) is not None
        ]
        return min(times, default=None)

    def _absent(self, now: float, fault: str, t: Track) -> list[Transition]:
        if t.absent_streak == 0:
            t.absent_since = now
        t.absent_streak += 1
        t.present_streak, t.streak_start = 0, None
        if not t.firing or t.absent_streak < self._clear:
            return []
        clean_for = now - (t.absent_since if t.absent_since is not None else now)
        if t.damped and clean_for < self._window:
            return []
        t.firing, t.damped = False, False
        return [self._transition(fault, t, ReportState.RESOLVED)]

    def _transition(self, fault: str, t: Track, state: ReportState) -> Transition:
        since = t.since if t.since is not None else 0.0
        return Transition(fault, state, since, t.sequence, t.message, dict(t.evidence))
