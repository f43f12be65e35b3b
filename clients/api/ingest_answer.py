"""The 202 answer to an Alertmanager payload or an agent report: what was accepted,
resolved and skipped, and on which incidents.

A payload some of whose firing alerts name nodes the inventory does not know is still a
202 (not a 207 Multi-Status: Alertmanager treats every 2xx alike, and a retry could not
make the node known): the known nodes' alerts went ahead, and `unknown_nodes` (with each
such alert in `skipped`, reason unknown_node) says what was left out."""

from __future__ import annotations

from fastapi import Response
from pydantic import BaseModel

from autoclusters.clients.api.intake import Outcome
from autoclusters.clients.api.metrics import ApiMetrics


class IncidentRef(BaseModel):
    node: str
    incident_id: str
    workflow_id: str
    opened: bool  # an alert of this request opened it (else all joined an open one)


class Skipped(BaseModel):
    index: int  # position in the payload's alerts
    fingerprint: str
    alertname: str
    node: str = ""
    reason: str  # unmapped, bad_fault, no_node, unknown_node, repaired_since
    detail: str


class IngestAnswer(BaseModel):
    accepted: int  # firing alerts now on their node's incident (including repeats)
    deduplicated: int  # of those, accepted before: nothing new was sent
    resolved: int  # resolved alerts recorded
    skipped: list[Skipped]
    incidents: list[IncidentRef]
    # Nodes named by firing alerts that the inventory does not know: nothing started for
    # them (their alerts are in `skipped`); the payload's other alerts went ahead.
    unknown_nodes: list[str] = []


def answer(
    outcomes: list[Outcome], resolved: int, skipped: list[Skipped], metrics: ApiMetrics, src: str
) -> Response:
    refs: dict[str, IncidentRef] = {}
    for o in outcomes:
        ref = refs.get(o.signal.node)
        if ref is None or ref.incident_id != o.delivered.incident_id:
            refs[o.signal.node] = ref = IncidentRef(
                node=o.signal.node,
                incident_id=o.delivered.incident_id,
                workflow_id=o.delivered.workflow_id,
                opened=False,
            )
        ref.opened = ref.opened or (o.delivered.opened and not o.repeat)
    # Known here (this process accepted it), or known to the incident (another replica, or
    # this one before a restart, delivered it first).
    repeats = sum(o.repeat or o.delivered.repeat for o in outcomes)
    metrics.of(metrics.alerts_deduplicated, src).inc(repeats)
    for s in skipped:
        metrics.alerts_rejected.labels(src, s.reason).inc()
    unknown = sorted({s.node for s in skipped if s.reason == "unknown_node"})
    if unknown:
        metrics.of(metrics.requests_partial, src).inc()
    body = IngestAnswer(
        accepted=len(outcomes),
        deduplicated=repeats,
        resolved=resolved,
        skipped=skipped,
        incidents=list(refs.values()),
        unknown_nodes=unknown,
    )
    # pydantic writes the JSON itself: no dict in between, no json.dumps.
    return Response(body.model_dump_json(), status_code=202, media_type="application/json")
