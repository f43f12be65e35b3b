"""Socket Mode: button clicks over Slack's WebSocket instead of a public HTTP endpoint.

For clusters whose API cannot be reached from the internet. Slack authenticates the
socket with the app-level token (xapp-...), so payloads arrive without a request
signature; each interactive envelope is acknowledged at once (Slack wants it within
three seconds) and fed to the same `InteractionHandler` the HTTP route uses.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from autoclusters.integrations.slack.interactivity import InteractionHandler, InteractionResponse

__all__ = ["SocketModeRunner"]

log = logging.getLogger("autoclusters.integrations.slack")


class SocketModeRunner:
    """Connects to Slack in Socket Mode and hands interactive payloads to `handler`.

    Example:
        runner = SocketModeRunner(app_token=xapp, web_client=client, handler=handler)
        await runner.start()
        ...
        await runner.stop()
    """

    def __init__(
        self, *, app_token: str, web_client: AsyncWebClient, handler: InteractionHandler
    ) -> None:
        self._app_token = app_token
        self._web_client = web_client
        self._handler = handler
        self._client: SocketModeClient | None = None

    async def start(self) -> None:
        # The client opens an aiohttp session on construction: build it inside the loop.
        self._client = SocketModeClient(app_token=self._app_token, web_client=self._web_client)
        self._client.socket_mode_request_listeners.append(self.on_request)
        await self._client.connect()

    async def stop(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def on_request(self, client: Any, req: SocketModeRequest) -> None:
        """Acknowledge an envelope at once, then run it through the handler."""
        await client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))
        await self.dispatch(req)

    async def dispatch(self, req: SocketModeRequest) -> InteractionResponse | None:
        """An interactive envelope's outcome; None for any other kind of envelope."""
        if req.type != "interactive":
            return None
        result = await self._handler.handle_payload(req.payload)
        if result.status_code != 200:
            log.warning("Slack (socket mode): payload refused: %s", result.body)
        return result
