"""`POST /v1/alerts/sharing`: Alertmanager says the inference SLO is at risk (the shipped
rule `InferenceSLOAtRisk`, routed here by deploy/alertmanager/alertmanager.yml); the
cluster's GpuSharing evaluates at once instead of at its next timer. Nothing is started:
without a running sharing workflow the answer says so. Resolved alerts change nothing."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel
from temporalio.client import Client

from autoclusters.clients.api.alertmanager import AlertmanagerPayload
from autoclusters.clients.api.state import ApiState
from autoclusters.clients.sharing import evaluate_now


class SharingAnswer(BaseModel):
    firing: int
    signalled: bool  # the sharing workflow was told (False: none runs, or nothing firing)
    cluster: str


def router(api: ApiState) -> APIRouter:
    r = APIRouter()

    @r.post(
        "/v1/alerts/sharing",
        status_code=202,
        response_model=SharingAnswer,
        summary="Alertmanager webhook: the inference SLO is at risk, GPU sharing evaluates now",
    )
    async def sharing_alert(request: Request) -> SharingAnswer:
        ep = "sharing"
        api.checks.authorize(request, ep, "alerts")
        payload = await api.checks.body(request, AlertmanagerPayload, "Alertmanager payload", ep)
        firing = [a for a in payload.alerts if a.status == "firing"]
        cluster = api.settings.cluster
        if not firing:
            return SharingAnswer(firing=0, signalled=False, cluster=cluster)
        why = ", ".join(sorted({a.labels.get("alertname", "?") for a in firing}))

        async def tell(client: Client) -> bool:
            return await evaluate_now(client, cluster, f"alert: {why}")

        signalled = await api.read(tell, ep)
        return SharingAnswer(firing=len(firing), signalled=signalled, cluster=cluster)

    return r
