"""Request latency by endpoint and status code, as plain ASGI middleware.

Not Starlette's `@app.middleware("http")` (BaseHTTPMiddleware): that wraps every request
in a task group and memory streams, and two of them took two thirds of the API's CPU
per alert (an alert storm of 50 concurrent senders: 515 requests/s with them, 1,645
without, one process).
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autoclusters.clients.api.metrics import ApiMetrics


class RequestTimer:
    def __init__(self, app: ASGIApp, metrics: ApiMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        code = 500  # no answer started: the server answers 500

        async def timed_send(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            # The router writes the matched route into the scope it was given.
            endpoint = getattr(scope.get("route"), "path", "unmatched")
            m = self.metrics
            m.of(m.request_duration, endpoint, str(code)).observe(time.monotonic() - started)
