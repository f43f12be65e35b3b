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
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.clients.incidents import OpenedIncident
from autoclusters.core.fault_evidence import FaultEvidence

log = logging.getLogger("autoclusters.api")

# Temporal calls in flight per node (Temporal refuses more than 10 updates in flight per
# workflow by default; other API replicas may be sending too).
PER_NODE_IN_FLIGHT = 4


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
    at: datetime | None = None  # when the source saw it start (an alert's startsAt)


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
    future: asyncio.Future[Delivered]


class Intake:
    def __init__(
        self,
        deliver: Deliver,
        *,
        dedupe: DedupeStore[Delivered],
        metrics: ApiMetrics,
        max_in_flight: int,
        timeout_s: float,
    ) -> None:
        self._deliver = deliver
        self._dedupe = dedupe
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self._lanes: dict[str, list[_Waiting]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, signals: list[Signal]) -> list[Outcome]:
        """Deliver every signal (or find it delivered already); all or raise."""
        claims = []
        for s in signals:
            claim = self._dedupe.claim(s.key)
            if claim.new:
                self._enqueue(_Waiting(s, claim.future))
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

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- lanes --------------------------------------------------------------------------

    def _enqueue(self, waiting: _Waiting) -> None:
        node = waiting.signal.node
        lane = self._lanes.get(node)
        if lane is None:
            lane = self._lanes[node] = []
            task = asyncio.create_task(self._drain(node), name=f"lane-{node}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
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
        groups = list(grouped.values())
        # The first goes alone: it may open the incident, which then opens on the fault
        # that came first. The rest go together, a few at a time (below Temporal's limit
        # of updates in flight per workflow): updates that arrive together reach the
        # worker in one workflow task.
        chunks = [groups[:1]] + [
            groups[i : i + PER_NODE_IN_FLIGHT] for i in range(1, len(groups), PER_NODE_IN_FLIGHT)
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
        try:
            opened = await self._call(node, signal, _report_key(group))
        except Exception as e:
            self._fail(group, e)
            return e
        # The incident itself says who opened it: exactly one caller, across API restarts
        # and replicas; a report it had already (a retry after a restart) opens nothing.
        first = opened.opened and not opened.repeat
        self._metrics.incidents.labels("opened").inc(1 if first else 0)
        self._metrics.incidents.labels("joined").inc(len(group) - (1 if first else 0))
        for i, w in enumerate(group):
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
                    self._deliver(node, fault, signal.source, key, signal.evidence, signal.at),
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
        self._metrics.temporal_errors.labels(kind).inc()
        log.warning("%d alert(s) for %s not accepted: %s", len(group), group[0].signal.node, error)
        for w in group:
            self._dedupe.fail(w.signal.key, w.future, error)


def _report_key(group: list[_Waiting]) -> str:
    """The same alert (or the same set of alerts) always gets the same key, so the incident
    answers a repeat (a retry, even after an API restart) as one and records nothing."""
    if len(group) == 1 and len(group[0].signal.key) <= 200:
        return f"report-{group[0].signal.key}"
    digest = hashlib.sha256("\n".join(sorted(w.signal.key for w in group)).encode())
    return f"reports-{len(group)}-{digest.hexdigest()[:32]}"
