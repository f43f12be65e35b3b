"""The provider's hand-off webhook, as a client: one signed POST of an incident's evidence
bundle (core/handoff.py, docs/handoff.md). Each try is signed afresh (a retry minutes later
must not carry a stale timestamp); the body and the idempotency key stay the same, so the
receiver can tell a retry from a new hand-off."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from autoclusters.core.handoff import IDEMPOTENCY_HEADER, HandoffSent, signed_headers

# A receiver that is busy or away answers these: try again later. Any other 4xx says the
# request itself is wrong (bad signature, unknown schema), which a retry cannot mend.
RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


class HandoffUnavailable(Exception):
    """The receiver could not be reached, or answered that it is busy: try again."""


class HandoffRefused(Exception):
    """The receiver refused the hand-off itself (a 4xx other than busy)."""


class HandoffClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        secret: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._http = http
        self._secret = secret
        self._clock = clock

    async def deliver(self, url: str, key: str, body: bytes) -> HandoffSent:
        headers = signed_headers(self._secret, int(self._clock()), body)
        headers[IDEMPOTENCY_HEADER] = key
        try:
            r = await self._http.post(url, content=body, headers=headers)
        except httpx.HTTPError as e:
            raise HandoffUnavailable(f"{url}: {type(e).__name__}: {e}") from e
        if r.status_code in RETRYABLE_STATUS:
            raise HandoffUnavailable(f"{url} answered {r.status_code}: {r.text[:200]}")
        if not r.is_success:
            raise HandoffRefused(f"{url} refused the hand-off: {r.status_code} {r.text[:200]}")
        ticket, duplicate = "", False
        try:
            said = r.json()
        except ValueError:
            said = None  # a receiver need not answer JSON: a 2xx is enough
        if isinstance(said, dict):
            ticket = str(said.get("ticket") or "")[:200]
            duplicate = said.get("duplicate") is True
        return HandoffSent(
            status=r.status_code, ticket=ticket, duplicate=duplicate, accepted_at=self._clock()
        )
