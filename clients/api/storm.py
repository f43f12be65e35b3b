"""Whether the API is in an alert storm, and so stops making requests wait for a worker.

Outside a storm a request waits until the node's incident took its alerts: Temporal's
update runs the incident's own check (it refuses a report once it is closing), which
needs a worker. In a storm that wait is the bottleneck: opening an incident costs a
worker tens of milliseconds of CPU (a new workflow run), so 100 nodes' first alerts queue
for seconds behind each other, and every request that names one of them waits too.

In a storm the intake (intake.py) answers once Temporal's server has what it needs,
without a worker: a node without a known incident gets one started with its first
alerts in the start request; alerts for a node whose incident is known open, of any
fault kind, are answered `joined` and trail to it in batches.

A storm: at least `nodes` nodes have alerts on their way to Temporal at once (a payload
names that many, or calls queue up behind a busy worker). It lasts `hold_s` past the
last moment that held, so a storm's lulls between payloads do not make the next alert
wait behind the backlog the storm left with the worker.
"""

from __future__ import annotations

import time

# Long enough to bridge the gaps between a storm's payloads, short enough that the API
# soon confirms each alert with its incident again once the storm has passed.
HOLD_S = 10.0


class StormWatch:
    def __init__(self, nodes: int, hold_s: float = HOLD_S) -> None:
        self._nodes = nodes  # 0: never a storm
        self._hold_s = hold_s
        self._last: float | None = None  # when `nodes` busy nodes were last seen

    def observe(self, busy_nodes: int) -> bool:
        """Is this a storm, now that `busy_nodes` nodes have alerts on their way?"""
        now = time.monotonic()
        if self._nodes and busy_nodes >= self._nodes:
            self._last = now
        return self._last is not None and now - self._last <= self._hold_s
