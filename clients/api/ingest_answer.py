"""The 202 answer to an Alertmanager payload or an agent report: what was accepted,
resolved and skipped, and on which incidents."""

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
    reason: str  # unmapped, bad_fault, no_node, unknown_node
    detail: str


class IngestAnswer(BaseModel):
    accepted: int  # firing alerts now on their node's incident (including repeats)
    deduplicated: int  # of those, accepted before: nothing new was sent
    resolved: int  # resolved alerts recorded
    skipped: list[Skipped]
    incidents: list[IncidentRef]


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
    body = IngestAnswer(
        accepted=len(outcomes),
        deduplicated=repeats,
        resolved=resolved,
        skipped=skipped,
        incidents=list(refs.values()),
    )
    # pydantic writes the JSON itself: no dict in between, no json.dumps.
    return Response(body.model_dump_json(), status_code=202, media_type="application/json")
