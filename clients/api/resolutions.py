"""Resolved alerts and reports, kept by the API until the workflow can record them.

NodeRemediation has no handler for "this fault cleared" yet, and a resolution must never
open an incident, so resolutions stay here (in memory, bounded per node) and are shown
with the node's incident by `GET /v1/incidents/{id}`.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from datetime import datetime

from pydantic import BaseModel

PER_NODE = 200
KEYS = 100_000


class Resolution(BaseModel):
    node: str
    fault: str
    source: str  # alertmanager, agent
    key: str  # fingerprint+startsAt, or the agent's report_id
    started_at: datetime  # startsAt / since
    resolved_at: datetime | None  # endsAt / observed_at
    received_at: datetime
    detail: str = ""


class ResolutionLog:
    def __init__(self) -> None:
        self._by_node: dict[str, deque[Resolution]] = {}
        self._keys: OrderedDict[str, None] = OrderedDict()

    def record(self, r: Resolution) -> bool:
        """False: this resolution was recorded before (a retry)."""
        if r.key in self._keys:
            return False
        self._keys[r.key] = None
        while len(self._keys) > KEYS:
            self._keys.popitem(last=False)
        self._by_node.setdefault(r.node, deque(maxlen=PER_NODE)).append(r)
        return True

    def for_node(self, node: str, since: datetime | None = None) -> list[Resolution]:
        return [r for r in self._by_node.get(node, ()) if since is None or r.received_at >= since]
