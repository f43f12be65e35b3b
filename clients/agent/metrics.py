"""The agent's /metrics: what each check read, in dcgm-exporter's and node-exporter's names.

`AgentMetrics` keeps the latest check's readings and the Xid history, and renders them on
every scrape (a prometheus-client collector on its own registry, so nothing else in the
process leaks into the page). The agent's loop serves the registry on HTTP
(`settings.metrics_port`; integrations/metrics_http.py: a token off loopback) and stops it.

Xids: the event stream is consumed by the check, so the exporter is told of them there. Like
dcgm-exporter, the last Xid of a GPU stays until the machine reboots (a new boot id), and
DCGM_EXP_XID_ERRORS_COUNT counts each Xid in the trailing window.

Jobs' progress (when the agent reads a progress directory): the last read of the rank files,
as progress_series.py names them.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from autoclusters.clients.agent.dcgm_series import XidState, gpu_series
from autoclusters.clients.agent.ib_series import ib_series
from autoclusters.clients.agent.progress_series import progress_series
from autoclusters.clients.agent.readings import GpuEvent, GpuReadings, IbReadings
from autoclusters.core.job_progress import RankProgress


class AgentMetrics:
    def __init__(self, node: str, *, xid_window_s: float = 300.0) -> None:
        self.node = node
        self.xid_window_s = xid_window_s
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self._lock = threading.Lock()  # checks write, scrapes (another thread) read
        self._gpus: GpuReadings | None = None
        self._ib: IbReadings | None = None
        self._boot = ""
        self._last_xid: dict[int, int] = {}
        self._xids: deque[tuple[float, int, int]] = deque()  # (at, GPU index, Xid)
        self._now = 0.0
        self._progress: tuple[float, list[RankProgress], dict[str, float]] | None = None
        self._version = 0  # one more when what `collect` yields changes: rendered again
        self._progress_mine = False  # whether the last progress read had a rank of ours

    def version(self) -> int:
        """Changes whenever what `collect` yields may have (the /metrics page's cache key)."""
        with self._lock:
            return self._version

    def observe(
        self,
        now: float,
        gpus: GpuReadings | None,
        events: list[GpuEvent],
        ib: IbReadings | None,
        boot_id: str = "",
    ) -> None:
        """One check's readings and the events it consumed."""
        with self._lock:
            self._version += 1
            if boot_id and self._boot and boot_id != self._boot:
                self._last_xid.clear()  # a reboot: the driver (and DCGM) start afresh
                self._xids.clear()
            self._boot = boot_id or self._boot
            self._gpus, self._ib, self._now = gpus, ib, now
            for e in events:
                gpu = self._gpu_of(e, gpus)
                if e.kind != "xid" or gpu is None:
                    continue
                self._last_xid[gpu] = e.code
                self._xids.append((e.at.timestamp(), gpu, e.code))
            while self._xids and self._xids[0][0] <= now - self.xid_window_s:
                self._xids.popleft()

    def observe_progress(
        self, now: float, ranks: list[RankProgress], thresholds: dict[str, float]
    ) -> None:
        """The rank files as last read, and each job's hang threshold."""
        mine = any(r.node == self.node for r in ranks)
        with self._lock:
            # Without a rank of this node, before and now, the series are the same empty
            # ones (the time only ages a rank's): the page need not be rendered again.
            if mine or self._progress_mine:
                self._version += 1
            self._progress_mine = mine
            self._progress = (now, list(ranks), dict(thresholds))

    @staticmethod
    def _gpu_of(e: GpuEvent, gpus: GpuReadings | None) -> int | None:
        if e.gpu is not None:
            return e.gpu
        for g in gpus.gpus if gpus is not None else []:
            if e.uuid and g.uuid == e.uuid:
                return g.index
        return None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts: dict[tuple[int, int], int] = {}
            for at, gpu, code in self._xids:
                if at > self._now - self.xid_window_s:
                    counts[(gpu, code)] = counts.get((gpu, code), 0) + 1
            xids = XidState(dict(self._last_xid), counts, int(self.xid_window_s * 1000))
            gpus, ib, progress = self._gpus, self._ib, self._progress
        yield from gpu_series(self.node, gpus, xids)
        yield from ib_series(ib)
        if progress is not None:
            yield from progress_series(self.node, *progress)

    def text(self) -> str:
        """The page a scrape gets."""
        return generate_latest(self.registry).decode()
