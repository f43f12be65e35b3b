"""Firing alerts whose fault began before their node's last repair: already handled.

A restarted Prometheus has no scrape cache, so it writes no staleness marker for a series
the exporter stopped exposing while it was away (the Xid count that a reboot cleared): the
old sample stays visible for the query lookback (5 min) and the alert fires again, with a
startsAt from before the repair. Alertmanager sends it after that incident has closed,
where it would open a second incident, drain the node just returned and requeue its job
a second time for one fault.

So a firing alert is left out (`skipped`, reason `repaired_since`) when an incident on its
node closed `resolved` after the alert's startsAt with a repair on it (a reboot or a
replacement, then a health gate the node passed): the fault it reports was there before
that repair, and the gate proved the node healthy after it. A fault that persists shows
again with a new start: the exporter's count goes away with the reboot, the alert resolves
and fires anew, and the node's agent reports it directly with a report of its own.

One visibility query per payload. A read that fails or is slow is unknown: nothing is
left out (logged), the alerts go ahead as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from temporalio.client import Client

from autoclusters.clients.incident_history import WORKFLOW_TYPE
from autoclusters.integrations import temporal
from autoclusters.integrations.temporal import quoted

log = logging.getLogger("autoclusters.api")

# Incidents read per payload: the newest repairs of its nodes are enough (the query asks
# only for incidents that closed after the oldest alert began).
LIMIT = 200


@dataclass(frozen=True)
class Repaired:
    incident_id: str
    closed_at: datetime


class RepairedSince:
    def __init__(self, cluster: str, wait_s: float) -> None:
        self._cluster = cluster
        self._wait_s = wait_s

    async def last_repairs(
        self, client: Client, alerts: Iterable[tuple[str, datetime]]
    ) -> dict[str, Repaired]:
        """For the nodes of `alerts` ((node, startsAt)), the newest resolved incident with
        a repair that closed after the oldest of them began; {} when the read failed."""
        starts: dict[str, datetime] = {}
        for node, at in alerts:
            starts[node] = min(at, starts.get(node, at))
        if not starts:
            return {}
        oldest = min(starts.values())
        nodes = ", ".join(quoted(n) for n in sorted(starts))
        query = (
            f"WorkflowType = '{WORKFLOW_TYPE}' AND Cluster = {quoted(self._cluster)}"
            f" AND Node IN ({nodes}) AND IncidentStatus = 'resolved'"
            f" AND RepairAction != 'none'"
            f" AND CloseTime > '{oldest.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}'"
        )
        try:
            return await asyncio.wait_for(self._read(client, query), self._wait_s)
        except Exception as e:  # noqa: BLE001  # unknown: nothing is left out, said so
            log.warning("reading the last repairs of %s failed: %r", nodes, e)
            return {}

    async def _read(self, client: Client, query: str) -> dict[str, Repaired]:
        out: dict[str, Repaired] = {}
        async for wf in client.list_workflows(query, limit=LIMIT):
            sa = wf.typed_search_attributes
            node = sa.get(temporal.NODE)
            incident = sa.get(temporal.INCIDENT_ID) or wf.id
            if not isinstance(node, str) or wf.close_time is None:
                continue
            seen = out.get(node)
            if seen is None or wf.close_time > seen.closed_at:
                out[node] = Repaired(str(incident), wf.close_time)
        return out


def handled(repaired: dict[str, Repaired], node: str, started_at: datetime) -> Repaired | None:
    """The repair that came after an alert that began at `started_at`, if one did."""
    r = repaired.get(node)
    return r if r is not None and r.closed_at > started_at else None
