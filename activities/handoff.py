"""The hand-off's outbound webhook (integrations/handoff.py) as an activity. Temporal's
retry policy (the workflow's, from the policy's `handoff.send_attempts`) retries a receiver
that is away or busy; a refusal, or a worker with no secret to sign with, fails at once."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.handoff import ANSWER_PATH, HandoffCall, HandoffSent
from autoclusters.integrations.handoff import HandoffClient, HandoffRefused, HandoffUnavailable


class HandoffActivities:
    """`client` None: no hand-off secret configured on this worker; every send fails.
    `api_url`: where the provider reaches the API (settings' api_public_url), for the
    request's `answer_url`."""

    def __init__(self, client: HandoffClient | None, api_url: str | None = None) -> None:
        self._client = client
        self._api_url = (api_url or "").rstrip("/")

    @activity.defn(name="send_handoff")
    async def send_handoff(self, call: HandoffCall) -> HandoffSent:
        if self._client is None:
            raise ApplicationError(
                "no hand-off secret configured on the worker (AUTOCLUSTERS_HANDOFF__SECRET): "
                "the hand-off cannot be signed",
                type="HandoffNotConfigured",
                non_retryable=True,
            )
        req = call.request
        if not req.answer_url and self._api_url:
            path = ANSWER_PATH.format(incident_id=req.incident_id)
            req = req.model_copy(update={"answer_url": self._api_url + path})
        async with heartbeating(f"hand off {req.incident_id}"):
            try:
                return await self._client.deliver(call.url, req.idempotency_key, req.body())
            except HandoffRefused as e:
                raise ApplicationError(str(e), type="HandoffRefused", non_retryable=True) from e
            except HandoffUnavailable as e:
                raise ApplicationError(str(e), type="HandoffUnavailable") from e
