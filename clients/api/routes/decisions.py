"""A person's decisions, each with their own operator token (clients/web/tokens.py). The
token says who they are (its grant's name); nothing in a body can claim another name. The
API signs the proof the worker checks (core/decision_proof.py), so these routes and Slack's
buttons are the only ways a decision counts:

- `POST /v1/incidents/{id}/decisions`: approve or reject the step an incident waits on. The
  workflow still checks that the person is one of the policy's approvers and that the step
  is the one it waits on. 200 the decision recorded; 404 no such incident; 409 refused (not
  an approver, not waiting on that step, already decided: recorded in the incident's
  history).
- `POST /v1/breaker/reset`: reset the fleet guard's tripped circuit breaker (the guard
  checks the person is one of the cluster's approvers). 200 the breaker as reset; 404 no
  guard runs; 409 refused (`error`: "not tripped", or "reset refused": not an approver, a
  proof that does not hold).
- `POST /v1/moves/{id}/decisions`: approve or reject GPU sharing's move waiting for a
  human. 200 what it did; 409 refused (no such move, not waiting, already decided, no
  sharing workflow).

All: 401/403 no operator token; 422 a bad body; 503 Temporal away."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client

from autoclusters.clients import breaker, incidents, sharing
from autoclusters.clients.api.checks import body_schema
from autoclusters.clients.api.state import ApiState
from autoclusters.core.guard import BreakerStatus
from autoclusters.core.models import ApprovalRecord
from autoclusters.core.sharing import MoveDecided

PATH = "/v1/incidents/{incident_id}/decisions"
BREAKER_PATH = "/v1/breaker/reset"
MOVE_PATH = "/v1/moves/{move_id}/decisions"
CLUSTER = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"


class DecisionBody(BaseModel):
    # No field names a person: who decides is the token's. An `approver` is an error.
    model_config = ConfigDict(extra="forbid")

    approve: bool
    # The step the person means (the CLI's --step, or the one it showed them): refused
    # unless the incident waits on exactly that one. None: whatever it waits on now.
    step: str | None = Field(default=None, pattern=r"^[a-z_]{1,40}$")
    comment: str = Field(default="", max_length=500)


class ResetBody(BaseModel):
    # No field names a person: who resets is the token's.
    model_config = ConfigDict(extra="forbid")

    cluster: str | None = Field(default=None, pattern=CLUSTER)  # None: the API's own


class MoveDecisionBody(BaseModel):
    # No field names a person: who decides is the token's.
    model_config = ConfigDict(extra="forbid")

    approve: bool
    cluster: str | None = Field(default=None, pattern=CLUSTER)  # None: the API's own


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    def signing_key(ep: str) -> str:
        if not settings.approval.keys:
            raise api.refusals.refuse(
                409, "refused", ep, "decision refused",
                "no approval keys ([approval] keys) configured on the API: "
                "it cannot vouch for anyone",
            )  # fmt: skip
        return settings.approval.keys[0].get_secret_value()

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

    @r.post(
        BREAKER_PATH,
        response_model=BreakerStatus,
        summary="Reset the fleet guard's tripped circuit breaker (an operator's own token)",
        openapi_extra=body_schema(ResetBody),
    )
    async def reset_breaker(request: Request) -> BreakerStatus:
        ep = "breaker_reset"
        who = api.checks.authorize(request, ep, "decide")
        d = await api.checks.body(request, ResetBody, "breaker reset", ep)
        cluster = d.cluster or settings.cluster
        key = signing_key(ep)

        async def go(client: Client) -> BreakerStatus:
            return await breaker.reset_breaker(
                client, cluster, who.name, key=key, via=f"token:{who.name}"
            )

        try:
            return await api.read(go, ep)
        except breaker.GuardNotStarted as e:
            raise api.refusals.refuse(404, "not_found", ep, "no fleet guard", str(e)) from None
        except breaker.BreakerNotTripped as e:
            raise api.refusals.refuse(409, "not_tripped", ep, "not tripped", str(e)) from None
        except breaker.GuardError as e:
            raise api.refusals.refuse(409, "refused", ep, "reset refused", str(e)) from None

    @r.post(
        MOVE_PATH,
        response_model=MoveDecided,
        summary="Approve or reject GPU sharing's move (an operator's own token)",
        openapi_extra=body_schema(MoveDecisionBody),
    )
    async def decide_move(request: Request, move_id: str) -> MoveDecided:
        ep = "move_decision"
        who = api.checks.authorize(request, ep, "decide")
        d = await api.checks.body(request, MoveDecisionBody, "move decision", ep)
        cluster = d.cluster or settings.cluster
        key = signing_key(ep)
        decision = sharing.proven_decision(
            cluster, move_id, d.approve, who.name, key=key, via=f"token:{who.name}"
        )

        async def go(client: Client) -> str:
            return await sharing.decide_move(client, cluster, decision)

        try:
            outcome = await api.read(go, ep)
        except sharing.MoveRefused as e:
            raise api.refusals.refuse(409, "refused", ep, "decision refused", str(e)) from None
        return MoveDecided(cluster=cluster, move_id=move_id, outcome=outcome, by=who.name)

    return r
