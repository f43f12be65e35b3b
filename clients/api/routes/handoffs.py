"""`POST /v1/handoffs/{incident_id}/answer`: the provider's answer to a hand-off
(docs/handoff.md). The signature over the raw body, with the secret shared with the
provider, is the authentication (no bearer token); it is checked before the body is
parsed. 401 a signature that does not hold (or no secret configured); 413 too large; 422
a body that is not an answer (naming the field); 404 no such incident; 409 the incident
takes no answer now (nothing handed off, answered otherwise, closed); 503 Temporal away;
200 the hand-off as answered (`repeat`: this answer was taken before)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from temporalio.client import Client

from autoclusters.clients import handoffs, incidents
from autoclusters.clients.api.checks import body_schema
from autoclusters.clients.api.state import ApiState
from autoclusters.core.faults import INCIDENT_ID_PATTERN
from autoclusters.core.handoff import (
    ANSWER_PATH,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureRefused,
    verify,
)
from autoclusters.core.handoff_answer import HandoffAnswer, HandoffRecord


class AnswerTaken(BaseModel):
    incident_id: str
    repeat: bool
    handoff: HandoffRecord


def router(api: ApiState) -> APIRouter:
    r = APIRouter()
    settings = api.settings

    @r.post(
        ANSWER_PATH,
        response_model=AnswerTaken,
        summary="The provider's answer to a hand-off (signed with the shared secret)",
        openapi_extra=body_schema(HandoffAnswer),
    )
    async def answer(request: Request, incident_id: str) -> AnswerTaken:
        ep = "handoff_answer"
        limit = settings.api_max_body_bytes
        raw = await request.body()
        if len(raw) > limit:
            raise api.refusals.refuse(
                413, "too_large", ep, "payload too large", f"more than {limit} bytes"
            )
        secret = settings.handoff.secret.get_secret_value() if settings.handoff.secret else None
        h = request.headers
        try:
            verify(secret, h.get(TIMESTAMP_HEADER), h.get(SIGNATURE_HEADER), raw, time.time())
        except SignatureRefused as e:
            raise api.refusals.refuse(401, "unauthorized", ep, "unauthorized", str(e)) from None
        try:
            given = HandoffAnswer.model_validate_json(raw)
        except ValidationError as e:
            raise api.refusals.invalid(e, "hand-off answer", ep) from None

        if not INCIDENT_ID_PATTERN.match(incident_id):  # not one of ours: Temporal need not say
            raise api.refusals.refuse(
                404, "not_found", ep, "no such incident",
                f"{incident_id[:80]!r} is not an incident id (inc-YYYYMMDD-HHMMSS-<node>)",
            )  # fmt: skip

        async def go(client: Client) -> tuple[HandoffRecord, bool]:
            return await handoffs.answer(client, settings, incident_id, given)

        try:
            rec, repeat = await api.read(go, ep)
        except incidents.IncidentNotFound as e:
            raise api.refusals.refuse(404, "not_found", ep, "no such incident", str(e)) from None
        except handoffs.AnswerRefused as e:
            raise api.refusals.refuse(409, "refused", ep, "answer refused", str(e)) from None
        return AnswerTaken(incident_id=incident_id, repeat=repeat, handoff=rec)

    return r
