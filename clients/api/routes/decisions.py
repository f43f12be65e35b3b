"""`POST /v1/incidents/{id}/decisions`: a person approves or rejects the step an incident
waits on, with their own operator token (clients/web/tokens.py). The token says who they
are (its grant's name); nothing in the body can claim another name. The API signs the proof
the worker checks (core/decision_proof.py), so this route and Slack's buttons are the only
ways a decision counts; the workflow still checks that the person is one of the policy's
approvers and that the step is the one it waits on.

Answers: 200 the decision recorded; 401/403 no operator token; 404 no such incident; 409
refused (not an approver, not waiting on that step, already decided: recorded in the
incident's history); 422 a bad body; 503 Temporal away."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client

from autoclusters.clients import incidents
from autoclusters.clients.api.checks import body_schema
from autoclusters.clients.api.state import ApiState
from autoclusters.core.models import ApprovalRecord

PATH = "/v1/incidents/{incident_id}/decisions"


class DecisionBody(BaseModel):
    # No field names a person: who decides is the token's. An `approver` is an error.
    model_config = ConfigDict(extra="forbid")

    approve: bool
    # The step the person means (the CLI's --step, or the one it showed them): refused
    # unless the incident waits on exactly that one. None: whatever it waits on now.
    step: str | None = Field(default=None, pattern=r"^[a-z_]{1,40}$")
    comment: str = Field(default="", max_length=500)


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    @r.post(
        PATH,
        response_model=ApprovalRecord,
        summary="Approve or reject the step an incident waits on (an operator's own token)",
        openapi_extra=body_schema(DecisionBody),
    )
    async def decide(request: Request, incident_id: str) -> ApprovalRecord:
        ep = "decision"
        who = api.checks.authorize(request, ep, "decide")
        d = await api.checks.body(request, DecisionBody, "decision", ep)

        async def go(client: Client) -> ApprovalRecord:
            return await incidents.decide(
                client, settings, incident_id, who.name, d.approve, d.comment, d.step,
                via=f"token:{who.name}",
            )  # fmt: skip

        try:
            return await api.read(go, ep)
        except incidents.IncidentNotFound as e:
            raise api.refusals.refuse(404, "not_found", ep, "no such incident", str(e)) from None
        except incidents.DecisionRefused as e:
            raise api.refusals.refuse(409, "refused", ep, "decision refused", str(e)) from None

    return r
