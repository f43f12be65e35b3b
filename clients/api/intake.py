"""From accepted alerts to Temporal: one lane per node, so a storm stays cheap and ordered.

Each node has at most one Temporal call (update-with-start on its incident workflow) in
flight. Alerts for the node that arrive meanwhile wait in its lane and go out together,
one call per fault kind, when the call before returns. A storm of 10,000 alerts over 100
nodes is then a few hundred calls, not 10,000, and never runs into Temporal's limit on
updates in flight per workflow (10 by default). A bounded semaphore caps calls in flight
over all nodes.

A request is answered only when every one of its alerts is settled: accepted by Temporal
(202), or failed (503, and Alertmanager retries). Calls that outlive the request that
asked for them still finish: their alerts are then known here, and the retry is a repeat.

One exception keeps a storm of repeats cheap: an alert of a fault kind the node's open
incident already has (OpenIncidents: so Temporal said less than api_open_incident_ttl_s
ago) is answered `joined` at once and trails: it waits api_join_flush_s for the node's
other trailing alerts and goes out with them in one call (the incident still counts it
and keeps its evidence). A trailing call that fails forgets the node's entry and is sent
again (the incident was closing: the retry opens the node's next incident), so an
accepted alert is never dropped while the API runs. A new fault kind waits, outside a storm.

In a storm (storm.py: many nodes' alerts on their way at once) nothing waits for a worker:
a node with no incident known open gets one started (server only, `Start`) with the
first fault kind's alerts in the start request, answered `opened` once Temporal's server
has it; its other alerts, and those of any fault kind for a node whose incident is known
open (or was, while a delivery to it is under way), are answered `joined` and trail as
above, all of a node's kinds in one update (`DeliverAll`) to the run they joined. A start
that finds the node's incident running is a cheap check: the run we knew of still runs
(joined), or one we know nothing of does, and those alerts go the way they go outside a
storm. Deliveries of what was answered already hold at most half the calls in flight, so
the starts requests wait for are not queued behind them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TypeVar

from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.clients.api.open_incidents import OpenIncident, OpenIncidents
from autoclusters.clients.api.storm import StormWatch
from autoclusters.clients.incidents import OpenedIncident
from autoclusters.clients.storm_calls import StartedIncident
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultReport

log = logging.getLogger("autoclusters.api")

# Temporal calls in flight per node (Temporal refuses more than 10 updates in flight per
# workflow by default; other API replicas may be sending too).
PER_NODE_IN_FLIGHT = 4
# A trailing alert's call failed: sent again after these waits, then given up (logged,
# and its dedupe key forgotten, so the source's next re-send delivers it again).
TRAIL_RETRIES_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)


class TemporalUnavailable(Exception):
    """Temporal did not accept in time (down, overloaded, no worker): retry later."""

    def __init__(self, message: str, kind: str = "unavailable") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Signal:
    """One firing alert or agent report, bound for its node's incident."""

    key: str  # dedupe key: stable across retries of the same alert
    node: str
    fault: str
    source: str  # alertmanager, agent: the incident's opened_by / the fault's source
    evidence: FaultEvidence | None = None  # labels and annotations, or the agent's readings
    # Or how to make it, when it is sent: most alerts of a storm are repeats or trail in a
    # batch that carries its first alert's evidence, and never need theirs.
    evidence_of: Callable[[], FaultEvidence | None] | None = None
    at: datetime | None = None  # when the source saw it start (an alert's startsAt)

    def described(self) -> FaultEvidence | None:
        if self.evidence is None and self.evidence_of is not None:
            return self.evidence_of()
        return self.evidence


@dataclass(frozen=True)
class Delivered:
    incident_id: str
    workflow_id: str
    opened: bool  # this alert opened the incident (else it joined the open one)
    repeat: bool = False  # the incident had it already (a retry another replica sent first)


@dataclass(frozen=True)
class Outcome:
    signal: Signal
    delivered: Delivered
    repeat: bool  # accepted before (or in flight for another request): nothing new sent


R = TypeVar("R")
# node, fault, source, report key, evidence, start, alerts it stands for -> R
_Sends = Callable[[str, str, str, str, FaultEvidence | None, datetime | None, int], Awaitable[R]]
# The incident it opened or joined (Temporal's update: the incident's worker took it).
Deliver = _Sends[OpenedIncident]
# The same, started with the report in its request (Temporal's server took it, no worker
# yet); or, when the node's incident runs already, its run (and nothing was sent to it).
Start = _Sends[StartedIncident]
# node, one report per fault kind (drafts: no incident id or token), the incident (and
# run) they were answered with, if known -> the incident that took them all in one update
DeliverAll = Callable[[str, list[FaultReport], OpenIncident | None], Awaitable[OpenedIncident]]


@dataclass
class _Waiting:
    signal: Signal
    future: asyncio.Future[Delivered]  # settled already when it trails
    trailing: bool = False  # answered from OpenIncidents: nobody waits on this call
    attempts: int = 0  # failed calls so far (trailing only)


class Intake:
    def __init__(
        self,
        deliver: Deliver,
        *,
        dedupe: DedupeStore[Delivered],
        metrics: ApiMetrics,
        max_in_flight: int,
        timeout_s: float,
        open_incidents: OpenIncidents | None = None,
        join_flush_s: float = 0.5,
        start: Start | None = None,
        storm: StormWatch | None = None,
        deliver_all: DeliverAll | None = None,
    ) -> None:
        self._deliver = deliver
        self._start = start
        self._deliver_all = deliver_all
        self._storm = storm if storm is not None else StormWatch(nodes=0)
        self._dedupe = dedupe
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._open = open_incidents if open_incidents is not None else OpenIncidents(ttl_s=0)
        self._join_flush_s = join_flush_s
        self._slots = asyncio.Semaphore(max_in_flight)
        # Calls that deliver only what was answered already take at most half the slots:
        # behind a busy worker they last seconds, and a start a request waits for must
        # not queue behind them.
        self._trailing_slots = asyncio.Semaphore(max(1, max_in_flight // 2))
        self._lanes: dict[str, list[_Waiting]] = {}
        self._trailing: dict[str, list[_Waiting]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, signals: list[Signal]) -> list[Outcome]:
        """Deliver every signal (or find it delivered already); all or raise."""
        claims = []
        storm = self._in_storm()
        joined = 0
        for s in signals:
            claim = self._dedupe.claim(s.key)
            if claim.new:
                known = self._storm_known(s.node) if storm else self._open.joined(s.node, s.fault)
                if known is None:
                    self._enqueue(_Waiting(s, claim.future))
                else:
                    waiting = _Waiting(s, claim.future)
                    self._answer_joined(waiting, known)
                    self._trail(waiting, self._join_flush_s)
                    joined += 1
            claims.append((s, claim))
        self._count_joined(joined)
        pending = {c.future for _, c in claims if not c.future.done()}
        if pending:
            _, late = await asyncio.wait(pending, timeout=self._timeout_s)
            if late:
                raise TemporalUnavailable(
                    f"Temporal did not accept {len(late)} alert(s) within {self._timeout_s:g}s "
                    "(is it up, and is a worker polling the task queue?)",
                    kind="timeout",
                )
        errors = [e for _, c in claims if (e := c.future.exception()) is not None]
        if errors:
            raise next((e for e in errors if isinstance(e, TemporalUnavailable)), errors[0])
        return [Outcome(s, c.future.result(), repeat=not c.new) for s, c in claims]

    async def close(self, drain_s: float = 5.0) -> None:
        """Send what trails now (joined alerts the incident has not counted yet), give the
        calls `drain_s` to finish, then stop."""
        trailing = [w for node in list(self._trailing) for w in self._trailing.pop(node)]
        for w in trailing:
            self._enqueue(w)
        lanes = {t for t in self._tasks if t.get_name().startswith("lane-")}
        if trailing and drain_s > 0:
            await asyncio.wait(lanes, timeout=drain_s)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _in_storm(self) -> bool:
        storm = self._storm.observe(len(self._lanes.keys() | self._trailing.keys()))
        self._metrics.storm.set(storm)
        return storm

    def _storm_known(self, node: str) -> OpenIncident | None:
        """In a storm any fault kind joins an incident known open; and one known open
        before joins while a delivery to it is queued or under way (behind a busy worker
        it outlasts api_open_incident_ttl_s): that delivery is the check, and what joins
        goes with the next one (a failure forgets the incident; what trails is sent
        again, to the node's next incident if this one closed)."""
        known = self._open.open_on(node)
        if known is None and (node in self._lanes or node in self._trailing):
            known = self._open.last(node)
        return known

    def _answer_joined(self, waiting: _Waiting, known: OpenIncident) -> None:
        """Answer `waiting` as joined to `known` now; it trails (delivered afterwards).
        The caller counts it (`_count_joined`)."""
        joined = Delivered(known.incident_id, known.workflow_id, opened=False)
        self._dedupe.settle(waiting.signal.key, waiting.future, joined)
        waiting.trailing = True

    def _count_joined(self, n: int) -> None:
        # Once per request, not per alert: a counter's inc() takes a lock.
        if n:
            self._metrics.of(self._metrics.incidents, "joined").inc(n)
            self._metrics.alerts_trailing.inc(n)

    # --- trailing alerts ----------------------------------------------------------------

    def _trail(self, waiting: _Waiting, after_s: float) -> None:
        """Send `waiting` with the node's other trailing alerts, `after_s` from now."""
        node = waiting.signal.node
        pending = self._trailing.get(node)
        if pending is None:
            pending = self._trailing[node] = []
            self._spawn(self._flush_later(node, after_s), f"trail-{node}")
        pending.append(waiting)

    async def _flush_later(self, node: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        for w in self._trailing.pop(node, []):
            self._enqueue(w)

    def _spawn(self, coro: Coroutine[None, None, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- lanes --------------------------------------------------------------------------

    def _enqueue(self, waiting: _Waiting) -> None:
        node = waiting.signal.node
        lane = self._lanes.get(node)
        if lane is None:
            lane = self._lanes[node] = []
            self._spawn(self._drain(node), f"lane-{node}")
        lane.append(waiting)

    async def _drain(self, node: str) -> None:
        batch: list[_Waiting] = []
        try:
            while batch := self._lanes[node]:
                self._lanes[node] = []
                await self._send(node, batch)
        except BaseException:  # cancelled at shutdown: nothing may wait forever
            stopped = TemporalUnavailable("the API is shutting down")
            for w in [*batch, *self._lanes.get(node, [])]:
                if not w.future.done():
                    self._dedupe.fail(w.signal.key, w.future, stopped)
            raise
        finally:
            self._lanes.pop(node, None)

    async def _send(self, node: str, batch: list[_Waiting]) -> None:
        if any(not w.trailing for w in batch) and self._in_storm():
            batch = await self._without_a_worker(node, batch)
        if batch:
            await self._send_batch(node, batch)

    async def _without_a_worker(self, node: str, batch: list[_Waiting]) -> list[_Waiting]:
        """In a storm: answer what `batch` waits for from what Temporal's server knows, and
        give back what is left to send now (nothing once it all trails)."""
        known = self._open.open_on(node)
        if known is None and self._start is not None:
            first = next(w for w in batch if not w.trailing).signal
            kind = (first.fault, first.source)
            opening = [w for w in batch if not w.trailing and _kind(w) == kind]
            sent_at = time.monotonic()
            send = partial(
                self._start, node, first.fault, first.source, _report_key(opening),
                first.described(), first.at, len(opening),
            )  # fmt: skip
            try:
                started = await self._call(node, first.fault, send)
            except Exception as e:
                self._fail(batch, e)
                return []
            if started.opened is not None:  # its start request carried `opening`
                self._opened(node, opening, started.opened, sent_at)
                sent = {id(w) for w in opening}
                batch = [w for w in batch if id(w) not in sent]
                known = self._open.open_on(node)  # None with api_open_incident_ttl_s = 0
            else:  # the incident we knew of, still running (else one we know nothing of)
                known = self._open.running(node, started.run_id, sent_at)
        if known is None:
            return batch  # ask the incident, as outside a storm
        waited = [w for w in batch if not w.trailing]
        for w in waited:
            self._answer_joined(w, known)
        self._count_joined(len(waited))
        for w in batch:
            self._trail(w, self._join_flush_s)  # with the node's next alerts
        return []

    def _opened(
        self, node: str, opening: list[_Waiting], opened: OpenedIncident, sent_at: float
    ) -> None:
        """`opening` opened the node's incident: its start request carried them."""
        fault = opening[0].signal.fault
        self._open.learn(
            node, opened.incident_id, opened.workflow_id, fault, sent_at, opened.run_id
        )
        m = self._metrics
        m.batch_size.observe(len(opening))
        m.of(m.incidents, "opened").inc()
        m.of(m.incidents, "joined").inc(len(opening) - 1)
        for i, w in enumerate(opening):
            done = Delivered(opened.incident_id, opened.workflow_id, opened=i == 0)
            self._dedupe.settle(w.signal.key, w.future, done)

    async def _send_batch(self, node: str, batch: list[_Waiting]) -> None:
        grouped: dict[tuple[str, str], list[_Waiting]] = {}
        for w in batch:
            grouped.setdefault(_kind(w), []).append(w)
        if self._deliver_all and all(w.trailing for w in batch):
            if len(grouped) > 1 or self._in_storm():
                # Answered already: one update for all kinds, to the run known, if any.
                await self._send_all(node, list(grouped.values()))
                return
        # Those a request waits for first; trailing ones (answered already) last.
        groups = sorted(grouped.values(), key=lambda g: all(w.trailing for w in g))
        # The first goes alone: it may open the incident, which then opens on the fault
        # that came first (not needed while the incident is known open). The rest go
        # together, a few at a time (below Temporal's limit of updates in flight per
        # workflow): updates that arrive together reach the worker in one workflow task.
        alone = 0 if self._open.open_on(node) is not None else 1
        chunks = [groups[:alone]] if alone else []
        chunks += [
            groups[i : i + PER_NODE_IN_FLIGHT]
            for i in range(alone, len(groups), PER_NODE_IN_FLIGHT)
        ]
        for n, chunk in enumerate(chunks):
            errors = await asyncio.gather(*(self._send_group(node, g) for g in chunk))
            down = next((e for e in errors if isinstance(e, TemporalUnavailable)), None)
            if down is not None:  # Temporal just failed this node: fail the rest at once
                for later in chunks[n + 1 :]:
                    for group in later:
                        self._fail(group, down)
                return

    async def _send_all(self, node: str, groups: list[list[_Waiting]]) -> None:
        """Trailing alerts of several kinds: one report each, in one call."""
        deliver_all = self._deliver_all
        assert deliver_all is not None
        now = datetime.now(UTC)
        reports = [
            FaultReport(
                incident_id="",
                fault=s.fault,
                source=s.source,
                at=s.at or now,
                evidence=s.described(),
                key=_report_key(g),
                alerts=len(g),
            )
            for g in groups
            for s in [g[0].signal]
        ]
        for g in groups:
            self._metrics.batch_size.observe(len(g))
        sent_at = time.monotonic()
        known = self._open.last(node)
        try:
            kinds = "+".join(r.fault for r in reports)
            send = partial(deliver_all, node, reports, known)
            opened = await self._call(node, kinds, send, True)
        except Exception as e:
            self._fail([w for g in groups for w in g], e)
            return
        for r in reports:
            self._open.learn(
                node, opened.incident_id, opened.workflow_id, r.fault, sent_at, opened.run_id
            )

    async def _send_group(self, node: str, group: list[_Waiting]) -> Exception | None:
        signal = group[0].signal
        self._metrics.batch_size.observe(len(group))
        sent_at = time.monotonic()
        send = partial(
            self._deliver, node, signal.fault, signal.source, _report_key(group),
            signal.described(), signal.at, len(group),
        )  # fmt: skip
        try:
            opened = await self._call(node, signal.fault, send, all(w.trailing for w in group))
        except Exception as e:
            self._fail(group, e)
            return e
        # The incident took the report, so it was open when the call went out.
        self._open.learn(
            node, opened.incident_id, opened.workflow_id, signal.fault, sent_at, opened.run_id
        )
        waited = [w for w in group if not w.trailing]
        if not waited:  # all answered `joined` before: counted then
            return None
        # The incident itself says who opened it: exactly one caller, across API restarts
        # and replicas; a report it had already (a retry after a restart) opens nothing.
        first = opened.opened and not opened.repeat
        m = self._metrics
        m.of(m.incidents, "opened").inc(1 if first else 0)
        m.of(m.incidents, "joined").inc(len(waited) - (1 if first else 0))
        for i, w in enumerate(waited):
            done = Delivered(
                opened.incident_id, opened.workflow_id, first and i == 0, opened.repeat
            )
            self._dedupe.settle(w.signal.key, w.future, done)
        return None

    async def _call(
        self, node: str, fault: str, send: Callable[[], Awaitable[R]], trailing: bool = False
    ) -> R:
        """`send()` (a deliver or a start), under the cap on calls in flight (and, for what
        was answered already, the cap on those)."""
        m = self._metrics
        async with self._trailing_slots if trailing else contextlib.nullcontext(), self._slots:
            m.temporal_in_flight.inc()
            started = time.monotonic()
            try:
                return await asyncio.wait_for(send(), self._timeout_s)
            except TimeoutError:
                raise TemporalUnavailable(
                    f"Temporal did not accept {fault} on {node} within {self._timeout_s:g}s",
                    kind="timeout",
                ) from None
            finally:
                m.temporal_in_flight.dec()
                m.temporal_duration.observe(time.monotonic() - started)

    def _fail(self, group: list[_Waiting], error: BaseException) -> None:
        kind = error.kind if isinstance(error, TemporalUnavailable) else "other"
        node = group[0].signal.node
        self._metrics.temporal_errors.labels(kind).inc()
        self._open.forget(node)  # closing, gone, or unreachable: ask Temporal again
        log.warning("%d alert(s) for %s not accepted: %s", len(group), node, error)
        for w in group:
            if not w.trailing:
                self._dedupe.fail(w.signal.key, w.future, error)
            elif w.attempts < len(TRAIL_RETRIES_S):
                # Answered `joined` already: ours to deliver. The next call is a plain
                # open-or-join, which opens the node's next incident if this one closed.
                w.attempts += 1
                self._trail(w, TRAIL_RETRIES_S[w.attempts - 1])
            else:
                self._metrics.alerts_trailing_lost.inc()
                log.error(
                    "alert %s for %s answered joined but never delivered (%s); "
                    "its next re-send delivers it again", w.signal.key, node, error,
                )  # fmt: skip
                self._dedupe.fail(w.signal.key, w.future, error)  # forgets the key


def _kind(w: _Waiting) -> tuple[str, str]:
    """What one call carries: one fault kind from one source."""
    return w.signal.fault, w.signal.source


def _report_key(group: list[_Waiting]) -> str:
    """The same alert (or the same set of alerts) always gets the same key, so the incident
    answers a repeat (a retry, even after an API restart) as one and records nothing."""
    if len(group) == 1 and len(group[0].signal.key) <= 200:
        return f"report-{group[0].signal.key}"
    digest = hashlib.sha256("\n".join(sorted(w.signal.key for w in group)).encode())
    return f"reports-{len(group)}-{digest.hexdigest()[:32]}"
