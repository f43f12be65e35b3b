"""The API's Temporal client, connected on first need."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from temporalio.client import Client
from temporalio.service import RPCStatusCode

from autoclusters.clients.api.intake import TemporalUnavailable

ClientFactory = Callable[[], Awaitable[Client]]

# Temporal answers worth retrying: the server is down, busy, or cut the call short.
RETRYABLE = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.ABORTED,
    RPCStatusCode.CANCELLED,
}


class TemporalGate:
    """The Temporal client, connected on first need: the API starts (and answers 503)
    while Temporal is down, and connects once it is up. Callers that arrive while a
    connect is under way share it, so a storm against a dead address makes one attempt."""

    def __init__(self, factory: ClientFactory, address: str, timeout_s: float) -> None:
        self._factory = factory
        self._address = address
        self._timeout_s = timeout_s
        self._client: Client | None = None
        self._connecting: asyncio.Task[Client] | None = None

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def client(self) -> Client:
        if self._client is not None:
            return self._client
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())
        # Shielded: a caller that gives up does not cancel the others' attempt.
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> Client:
        try:
            client = await asyncio.wait_for(self._factory(), self._timeout_s)
        except Exception as e:
            why = str(e) or type(e).__name__
            raise TemporalUnavailable(f"cannot reach Temporal at {self._address}: {why}") from None
        self._client = client
        return client
