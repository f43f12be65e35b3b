"""`POST /v1/alerts/alertmanager`: Alertmanager's webhook. Each firing alert opens or joins
its node's incident; each resolved one is recorded (and told to the node's open incident).
The status codes and their order are in clients/api/app.py."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime
from functools import partial

from fastapi import APIRouter, Request, Response

from autoclusters.clients.api.alertmanager import AlertmanagerPayload, MappedAlert, read_alerts
from autoclusters.clients.api.checks import body_schema, not_in_cluster
from autoclusters.clients.api.ingest_answer import IngestAnswer, Skipped, answer
from autoclusters.clients.api.intake import Signal
from autoclusters.clients.api.repaired_since import Repaired, handled
from autoclusters.clients.api.resolutions import Resolution
from autoclusters.clients.api.state import ApiState
from autoclusters.core.fault_evidence import FaultCleared, FaultEvidence, utc

log = logging.getLogger("autoclusters.api")

PATH = "/v1/alerts/alertmanager"


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    @r.post(
        PATH,
        status_code=202,
        response_model=IngestAnswer,
        openapi_extra=body_schema(AlertmanagerPayload),
        summary="Alertmanager webhook (version 4): open or join each node's incident",
    )
    async def alertmanager(request: Request) -> Response:
        ep, src = "alertmanager", "alertmanager"
        caller = api.checks.authorize(request, ep, "alerts").name
        payload = await api.checks.body(request, AlertmanagerPayload, "Alertmanager payload", ep)
        if payload.truncated_alerts:
            # Alertmanager dropped alerts from this notification (max_alerts): say so.
            api.metrics.alerts_truncated.inc(payload.truncated_alerts)
            log.warning(
                "alertmanager (%s): %d alert(s) truncated from group %s",
                caller, payload.truncated_alerts, payload.group_key[:120],
            )  # fmt: skip
        read = read_alerts(payload, api.faults)
        api.checks.refuse_unknown_faults(
            [(f"alerts[{m.index}]", m.fault) for m in read.mapped if m.alert.status == "firing"],
            ep,
        )
        # Counted once per request and status, not per alert: inc() takes a lock.
        for status, n in Counter(a.status for a in payload.alerts).items():
            api.metrics.of(api.metrics.alerts_received, src, status).inc(n)
        skipped = [
            Skipped(
                index=s.index,
                fingerprint=s.fingerprint,
                alertname=s.alertname,
                reason=s.reason,
                detail=s.detail,
            )  # fmt: skip
            for s in read.skipped
        ]
        known = await api.checks.known_nodes(
            (n for m in read.mapped for n in m.node_candidates), ep
        )
        unknown: list[MappedAlert] = []
        for m in read.mapped:
            m.node = next((n for n in m.node_candidates if n in known), "")
            if not m.node and m.alert.status == "firing":
                unknown.append(m)
        firing = [m for m in read.mapped if m.alert.status == "firing" and m.node]
        if unknown:
            # Refused (404) only when nothing else in the payload is ours to act on: else
            # the alerts for known nodes go ahead and the unknown are listed in the 202.
            names = sorted({m.node_candidates[0] for m in unknown})
            where = ", ".join(f"alerts[{m.index}]" for m in unknown[:10])
            resolving = sum(m.alert.status == "resolved" for m in read.mapped)
            api.checks.refuse_unknown_nodes(names, ep, where, others=len(firing) + resolving)
        skipped += [_unknown(m, settings.cluster) for m in unknown]
        now = datetime.now(UTC)
        resolved = sum(
            api.resolutions.record(_resolution(m, src, now))
            for m in read.mapped
            if m.alert.status == "resolved"
        )
        # Began before their node's last repair: handled already (a restarted Prometheus
        # fires an alert again on a sample from before the reboot).
        repaired = await api.last_repairs([(m.node, utc(m.alert.starts_at)) for m in firing])
        if repaired:
            stale = {m.index: r for m in firing
                     if (r := handled(repaired, m.node, utc(m.alert.starts_at)))}  # fmt: skip
            skipped += [_repaired(m, stale[m.index]) for m in firing if m.index in stale]
            firing = [m for m in firing if m.index not in stale]
        outcomes = await api.submit([_signal(m, src) for m in firing], ep)
        # After the firing ones: a resolution in the payload that opened the incident is
        # recorded on it too, and it lives in the incident, not in this process.
        for m in read.mapped:
            if m.alert.status == "resolved" and m.node:
                await api.clear(m.node, _cleared(m, src, now), ep)
        if outcomes or skipped:
            log.info(
                "alertmanager (%s): %d alerts: %d firing accepted, %d resolved, %d skipped",
                caller, len(payload.alerts), len(outcomes), resolved, len(skipped),
            )  # fmt: skip
        return answer(outcomes, resolved, skipped, api.metrics, src)

    return r


def _repaired(m: MappedAlert, by: Repaired) -> Skipped:
    return Skipped(
        index=m.index,
        fingerprint=m.fingerprint,
        alertname=m.alertname,
        node=m.node,
        reason="repaired_since",
        detail=(
            f"began {utc(m.alert.starts_at).isoformat()}, before {by.incident_id} repaired "
            f"{m.node} (closed {by.closed_at.isoformat()}); nothing was started"
        ),
    )


def _unknown(m: MappedAlert, cluster: str) -> Skipped:
    return Skipped(
        index=m.index,
        fingerprint=m.fingerprint,
        alertname=m.alertname,
        node=m.node_candidates[0],
        reason="unknown_node",
        detail=not_in_cluster(m.node_candidates[0], cluster),
    )


def _ended(m: MappedAlert) -> datetime | None:
    ends = m.alert.ends_at
    return ends if ends and ends.year > 1 else None  # firing alerts carry 0001-01-01


def _resolution(m: MappedAlert, src: str, now: datetime) -> Resolution:
    return Resolution(
        node=m.node or m.node_candidates[0],
        fault=m.fault,
        source=src,
        key=m.key,
        started_at=m.alert.starts_at,
        resolved_at=_ended(m),
        received_at=now,
        detail=m.alertname,
    )


def _cleared(m: MappedAlert, src: str, now: datetime) -> FaultCleared:
    return FaultCleared(
        fault=m.fault,
        source=src,
        key=m.key,
        starts_at=m.alert.starts_at,
        resolved_at=_ended(m) or now,
        detail=m.alertname,
    )


def _signal(m: MappedAlert, src: str) -> Signal:
    return Signal(
        key=m.key,
        node=m.node,
        fault=m.fault,
        source=src,
        evidence_of=partial(
            FaultEvidence.from_alert,
            key=m.key,
            starts_at=m.alert.starts_at,
            labels=m.alert.labels,
            annotations=m.alert.annotations,
        ),
        at=m.alert.starts_at,
    )
