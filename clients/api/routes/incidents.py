"""Reads: `GET /v1/incidents` (this cluster's incidents, the nodes' and the systemic ones,
filtered: clients/incident_listing.py) and
`GET /v1/incidents/{id}` (one incident's timeline, from the workflow's `status` query).
Open unless api_auth_reads."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from temporalio.client import Client

from autoclusters.clients import incident_listing, incidents
from autoclusters.clients.api.resolutions import Resolution
from autoclusters.clients.api.state import ApiState
from autoclusters.core.models import IncidentState, IncidentStateName


class IncidentDetail(BaseModel):
    incident_id: str
    workflow_id: str
    temporal_status: str
    incident: IncidentState
    # Resolutions of this node's faults received since the incident opened (kept by the
    # API until the workflow can record them).
    resolved_alerts: list[Resolution]


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    # One route for both kinds, not a sibling: the filters and `limit` apply to one list,
    # newest first, and a half that could not be read is said so beside the rows it
    # leaves out (`unknown`), where a second route's failure would pass unseen.
    @r.get(
        "/v1/incidents",
        response_model=incident_listing.IncidentListing,
        summary="This cluster's incidents: the nodes' and the systemic ones (`kind`)",
    )
    async def list_incidents(
        request: Request,
        state: Annotated[
            IncidentStateName | None,
            Query(description="open, waiting_approval, resolved, ... (anything else: 422)"),
        ] = None,
        node: Annotated[
            str | None, Query(description="a node's incidents, and the systemic ones it is in")
        ] = None,
        fault: str | None = None,
        limit: int = Query(100, ge=1, le=1000),
    ) -> incident_listing.IncidentListing:
        api.checks.authorize(request, "incidents", "read")
        return await api.read(
            lambda c: incident_listing.list_all_incidents(
                c, settings, state, node, fault, limit=limit
            ),
            "incidents",
        )

    @r.get(
        "/v1/incidents/{incident_id}",
        response_model=IncidentDetail,
        summary="One incident's timeline (the workflow's status query)",
    )
    async def get_incident(request: Request, incident_id: str) -> IncidentDetail:
        ep = "incident"
        api.checks.authorize(request, ep, "read")

        async def look(client: Client) -> IncidentDetail:
            handle = await incidents.find_incident(client, settings, incident_id)
            state, status = await incidents.incident_state(handle)
            assert state is not None
            node = state.request.node
            return IncidentDetail(
                incident_id=incident_id,
                workflow_id=handle.id,
                temporal_status=status,
                incident=state,
                resolved_alerts=api.resolutions.for_node(node, state.request.opened_at),
            )

        try:
            return await api.read(look, ep)
        except incidents.IncidentNotFound as e:
            raise api.refusals.refuse(404, "not_found", ep, "no such incident", str(e)) from None

    return r
