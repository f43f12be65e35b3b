"""What Temporal knows now, as gauges: open incidents and each cluster's fleet guard.

Read at scrape time and kept `cache_s` seconds, so a burst of scrapes costs one read:
- open incidents: the running NodeRemediation workflows from Temporal's visibility, counted
  by the search attributes the incident keeps (integrations/temporal.py): Cluster,
  IncidentStatus (open, waiting_approval), Fault and RepairAction (the rung);
- each running FleetGuard's `status` query: breaker tripped or not, incidents waiting in
  its queue by kind (held), nodes repairing and out of service, hot spares free.

Prometheus's scrape runs in the HTTP server's thread; the Temporal client lives on the
worker's event loop, so the read is handed to that loop and awaited with a timeout. A
scrape that finds Temporal unreachable serves the last figures with
`autoclusters_worker_temporal_up` 0.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from temporalio.client import Client

from autoclusters.core.guard import GUARD_WORKFLOW, GuardStatus
from autoclusters.integrations import temporal

log = logging.getLogger("autoclusters.worker.metrics")

INCIDENT_WORKFLOW = "NodeRemediation"
INCIDENT_LABELS = ["cluster", "status", "fault", "rung"]


@dataclass
class Snapshot:
    incidents: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)
    guards: list[GuardStatus] = field(default_factory=list)
    up: bool = False
    at: float = 0.0


class TemporalCollector(Collector):
    def __init__(
        self,
        client: Client,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        cache_s: float = 5.0,
        timeout_s: float = 5.0,
    ) -> None:
        """Build it on the worker's event loop (or pass `loop`)."""
        self._client = client
        self._loop = loop or asyncio.get_running_loop()
        self._cache_s = cache_s
        self._timeout_s = timeout_s
        self._snap = Snapshot()
        self._lock = threading.Lock()

    async def refresh(self) -> Snapshot:
        """Read Temporal now; on failure keep the last figures, marked down."""
        try:
            snap = await asyncio.wait_for(self._read(), self._timeout_s)
        except Exception as e:  # noqa: BLE001 - a scrape must answer even without Temporal
            log.warning("metrics: Temporal not read: %s: %s", type(e).__name__, e)
            snap = Snapshot(self._snap.incidents, self._snap.guards, up=False)
        snap.at = time.monotonic()
        self._snap = snap
        return snap

    async def _read(self) -> Snapshot:
        rpc = timedelta(seconds=self._timeout_s)
        snap = Snapshot(up=True)
        running = f"WorkflowType = '{INCIDENT_WORKFLOW}' AND ExecutionStatus = 'Running'"
        async for wf in self._client.list_workflows(running, rpc_timeout=rpc):
            sa = wf.typed_search_attributes
            snap.incidents[
                (
                    sa.get(temporal.CLUSTER) or "unknown",
                    sa.get(temporal.INCIDENT_STATUS) or "open",
                    sa.get(temporal.FAULT) or "unknown",
                    sa.get(temporal.REPAIR_ACTION) or "none",
                )
            ] += 1
        guards = f"WorkflowType = '{GUARD_WORKFLOW}' AND ExecutionStatus = 'Running'"
        async for wf in self._client.list_workflows(guards, rpc_timeout=rpc):
            handle = self._client.get_workflow_handle(wf.id, run_id=wf.run_id)
            try:
                status = await handle.query("status", result_type=GuardStatus, rpc_timeout=rpc)
            except Exception as e:  # noqa: BLE001 - one guard unread must not hide the rest
                log.warning("metrics: fleet guard %s not read: %s", wf.id, e)
                snap.up = False
                continue
            snap.guards.append(status)
        return snap

    def _current(self) -> Snapshot:
        if time.monotonic() - self._snap.at < self._cache_s:
            return self._snap
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            return self._snap  # on the loop itself: cannot wait for it (tests call refresh)
        with self._lock:
            if time.monotonic() - self._snap.at < self._cache_s:
                return self._snap  # another scrape refreshed it meanwhile
            future = asyncio.run_coroutine_threadsafe(self.refresh(), self._loop)
            try:
                return future.result(timeout=self._timeout_s + 1)
            except Exception:  # noqa: BLE001 - the loop is busy or closed: last figures
                future.cancel()
                return Snapshot(self._snap.incidents, self._snap.guards, up=False)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        return iter(_families(self._current()))

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(_families(Snapshot()))


def _families(snap: Snapshot) -> list[GaugeMetricFamily]:
    incidents = GaugeMetricFamily(
        "autoclusters_incidents",
        "Open incidents (running NodeRemediation workflows) by cluster, incident status "
        "(open, waiting_approval), fault and rung (RepairAction).",
        labels=INCIDENT_LABELS,
    )
    for key, n in sorted(snap.incidents.items()):
        incidents.add_metric(list(key), n)
    per_guard = {
        "autoclusters_guard_breaker_tripped": "1 while the cluster's circuit breaker holds "
        "every repair (until a human resets it).",
        "autoclusters_guard_repairing": "Nodes the fleet guard admitted to a repair now.",
        "autoclusters_guard_out_of_service": "Nodes the fleet guard counts out of service "
        "(against its floor: quarantined, left drained, drained while held).",
        "autoclusters_guard_spares_free": "Hot spares free now.",
    }
    guard = {n: GaugeMetricFamily(n, h, labels=["cluster"]) for n, h in per_guard.items()}
    waiting = GaugeMetricFamily(
        "autoclusters_guard_waiting",
        "Incidents held in the fleet guard's queue, by what they wait for (quarantine, repair, "
        "held_drain).",
        labels=["cluster", "kind"],
    )
    for g in snap.guards:
        st = g.state
        guard["autoclusters_guard_breaker_tripped"].add_metric([g.cluster], int(st.breaker.tripped))
        guard["autoclusters_guard_repairing"].add_metric([g.cluster], len(st.repairing))
        guard["autoclusters_guard_out_of_service"].add_metric([g.cluster], len(st.counted_out()))
        guard["autoclusters_guard_spares_free"].add_metric([g.cluster], len(st.spares or []))
        for kind in ("quarantine", "repair", "held_drain"):
            waiting.add_metric([g.cluster, kind], sum(1 for w in st.queue if w.kind == kind))
    up = GaugeMetricFamily(
        "autoclusters_worker_temporal_up",
        "1 when the last read of Temporal for these gauges succeeded.",
        value=int(snap.up),
    )
    return [incidents, *guard.values(), waiting, up]
