"""What the node health agent sends: `POST /v1/reports` (a NodeReport: open or join the
node's incident, or a fault cleared) and the health snapshot (evidence for the node's open
incident's health gate; it starts nothing). Answered as the Alertmanager webhook is."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from autoclusters.clients.api.checks import body_schema, not_in_cluster
from autoclusters.clients.api.evidence import SnapshotAnswer, forward
from autoclusters.clients.api.ingest_answer import IngestAnswer, Skipped, answer
from autoclusters.clients.api.intake import Signal, TemporalUnavailable
from autoclusters.clients.api.resolutions import Resolution
from autoclusters.clients.api.state import ApiState
from autoclusters.core.fault_evidence import FaultCleared, FaultEvidence
from autoclusters.core.models import workflow_id
from autoclusters.core.node_report import (
    SNAPSHOTS_PATH,
    HealthSnapshot,
    NodeReport,
    ReportState,
)

PATH = "/v1/reports"


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    @r.post(
        PATH,
        status_code=202,
        response_model=IngestAnswer,
        openapi_extra=body_schema(NodeReport),
        summary="A node health agent's report: open or join the node's incident",
    )
    async def report(request: Request) -> Response:
        ep, src = "reports", "agent"
        api.checks.authorize(request, ep, "reports")
        rep = await api.checks.body(request, NodeReport, "NodeReport", ep)
        api.metrics.of(api.metrics.alerts_received, src, rep.state.value).inc()
        firing = rep.state == ReportState.FIRING
        if firing:
            api.checks.refuse_unknown_faults([("fault", rep.fault)], ep)
        known = await api.checks.known_nodes([rep.node], ep)
        skipped: list[Skipped] = []
        if rep.node not in known and firing:
            api.checks.refuse_unknown_nodes([rep.node], ep)
            skipped.append(
                Skipped(
                    index=0,
                    fingerprint=rep.report_id,
                    alertname=rep.fault,
                    node=rep.node,
                    reason="unknown_node",
                    detail=not_in_cluster(rep.node, settings.cluster),
                )  # fmt: skip
            )
        key = f"agent:{rep.report_id}"
        if rep.state == ReportState.RESOLVED:
            recorded = api.resolutions.record(
                Resolution(
                    node=rep.node,
                    fault=rep.fault,
                    source=src,
                    key=key,
                    started_at=rep.since,
                    resolved_at=rep.observed_at,
                    received_at=datetime.now(UTC),
                    detail=rep.message,
                )  # fmt: skip
            )
            cleared = FaultCleared(
                fault=rep.fault,
                source=src,
                key=key,
                starts_at=rep.since,
                resolved_at=rep.observed_at,
                detail=rep.message,
            )
            await api.clear(rep.node, cleared, ep)
            return answer([], int(recorded), skipped, api.metrics, src)
        evidence = FaultEvidence.from_agent(
            key=key, since=rep.since, message=rep.message, readings=rep.evidence
        )
        signals = (
            []
            if skipped
            else [
                Signal(
                    key=key,
                    node=rep.node,
                    fault=rep.fault,
                    source=src,
                    evidence=evidence,
                    at=rep.since,
                )
            ]
        )
        outcomes = await api.submit(signals, ep)
        return answer(outcomes, 0, skipped, api.metrics, src)

    @r.post(
        SNAPSHOTS_PATH,
        status_code=202,
        response_model=SnapshotAnswer,
        openapi_extra=body_schema(HealthSnapshot),
        summary="A node agent's health snapshot: evidence for the node's open incident",
    )
    async def health_snapshot(request: Request) -> JSONResponse:
        ep = "health_snapshots"
        api.checks.authorize(request, ep, "reports")
        snap = await api.checks.body(request, HealthSnapshot, "HealthSnapshot", ep)
        if snap.node not in await api.checks.known_nodes([snap.node], ep):
            api.checks.refuse_unknown_nodes([snap.node], ep)
            wf_id = workflow_id(settings.cluster, snap.node)
            detail = not_in_cluster(snap.node, settings.cluster)
            body = SnapshotAnswer(node=snap.node, forwarded=False, workflow_id=wf_id, detail=detail)
        else:
            try:
                body = await asyncio.wait_for(
                    forward(await api.gate.client(), settings.cluster, snap),
                    settings.api_temporal_timeout_s,
                )
            except TimeoutError:
                late = TemporalUnavailable("Temporal did not take the snapshot in time", "timeout")
                raise api.refusals.unavailable(late, ep) from None
            except TemporalUnavailable as e:
                raise api.refusals.unavailable(e, ep) from None
        return JSONResponse(body.model_dump(mode="json"), status_code=202)

    return r
