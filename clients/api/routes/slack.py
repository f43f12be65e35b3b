"""`POST /slack/interactions`: Approve / Reject clicks. The Slack signature over the raw
body is the authentication (no bearer token); the click becomes the Temporal Update: the
incident's, or, for a button of GPU sharing's move (step `move`, which no incident
has), the cluster's sharing workflow's `decide_waiting_move`, each with the API's proof that
the clicker (their Slack id, verified by the signature) decided (core/decision_proof.py).
Either refusal is a PermissionError, which the handler shows to the clicker. Served only
with a Slack signing secret."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from autoclusters.clients import incidents
from autoclusters.clients.api.state import ApiState
from autoclusters.clients.sharing import decide_move, proven_decision
from autoclusters.core.sharing import MOVE_APPROVAL_STEP
from autoclusters.core.slack_config import SlackConfig


def router(api: ApiState, slack: SlackConfig) -> APIRouter:
    # Here, not at the top: the Slack client library takes a third of a second to import,
    # and an API without Slack never needs it.
    from autoclusters.integrations.slack import InteractionHandler

    settings = api.settings

    async def decide(
        *, incident_id: str, step: str, approver: str, approve: bool, comment: str = "",
        via: str,
    ) -> object:  # fmt: skip
        client = await api.gate.client()
        if step == MOVE_APPROVAL_STEP:
            if not settings.approval.keys:
                raise PermissionError(
                    "no approval keys ([approval] keys) configured on the API: it cannot vouch "
                    "for anyone"
                )
            key = settings.approval.keys[0].get_secret_value()
            decision = proven_decision(
                settings.cluster, incident_id, approve, approver, key=key, via=via
            )
            return await decide_move(client, settings.cluster, decision)
        return await incidents.decide(
            client, settings, incident_id, approver, approve, comment, step=step, via=via
        )

    handler = InteractionHandler.from_config(slack, decide=decide)
    r = APIRouter()

    @r.post("/slack/interactions", summary="Slack interactivity (signed by Slack)")
    async def slack_interactions(request: Request) -> JSONResponse:
        answer = await handler.handle(await request.body(), request.headers)
        return JSONResponse(answer.body, status_code=answer.status_code)

    return r
