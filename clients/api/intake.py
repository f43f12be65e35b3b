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
accepted alert is never dropped while the API runs. A new fault kind always waits.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime

from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.clients.api.open_incidents import OpenIncidents
from autoclusters.clients.incidents import OpenedIncident
from autoclusters.core.fault_evidence import FaultEvidence

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


# node, fault, source, report key, evidence, start -> the incident it opened or joined
Deliver = Callable[
    [str, str, str, str, FaultEvidence | None, datetime | None], Awaitable[OpenedIncident]
]


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
    ) -> None:
        self._deliver = deliver
        self._dedupe = dedupe
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._open = open_incidents if open_incidents is not None else OpenIncidents(ttl_s=0)
        self._join_flush_s = join_flush_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self._lanes: dict[str, list[_Waiting]] = {}
        self._trailing: dict[str, list[_Waiting]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, signals: list[Signal]) -> list[Outcome]:
        """Deliver every signal (or find it delivered already); all or raise."""
        claims = []
        for s in signals:
            claim = self._dedupe.claim(s.key)
            if claim.new:
                known = self._open.joined(s.node, s.fault)
                if known is None:
                    self._enqueue(_Waiting(s, claim.future))
                else:
                    joined = Delivered(known.incident_id, known.workflow_id, opened=False)
                    self._dedupe.settle(s.key, claim.future, joined)
                    self._metrics.of(self._metrics.incidents, "joined").inc()
                    self._metrics.alerts_trailing.inc()
                    self._trail(_Waiting(s, claim.future, trailing=True), self._join_flush_s)
            claims.append((s, claim))
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
        grouped: dict[tuple[str, str], list[_Waiting]] = {}
        for w in batch:
            grouped.setdefault((w.signal.fault, w.signal.source), []).append(w)
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

    async def _send_group(self, node: str, group: list[_Waiting]) -> Exception | None:
        signal = group[0].signal
        self._metrics.batch_size.observe(len(group))
        sent_at = time.monotonic()
        try:
            opened = await self._call(node, signal, _report_key(group))
        except Exception as e:
            self._fail(group, e)
            return e
        # The incident took the report, so it was open when the call went out.
        self._open.learn(node, opened.incident_id, opened.workflow_id, signal.fault, sent_at)
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

    async def _call(self, node: str, signal: Signal, key: str) -> OpenedIncident:
        m, fault = self._metrics, signal.fault
        async with self._slots:
            m.temporal_in_flight.inc()
            started = time.monotonic()
            try:
                return await asyncio.wait_for(
                    self._deliver(node, fault, signal.source, key, signal.described(), signal.at),
                    self._timeout_s,
                )
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


def _report_key(group: list[_Waiting]) -> str:
    """The same alert (or the same set of alerts) always gets the same key, so the incident
    answers a repeat (a retry, even after an API restart) as one and records nothing."""
    if len(group) == 1 and len(group[0].signal.key) <= 200:
        return f"report-{group[0].signal.key}"
    digest = hashlib.sha256("\n".join(sorted(w.signal.key for w in group)).encode())
    return f"reports-{len(group)}-{digest.hexdigest()[:32]}"
