"""Several notifiers at once (console, Slack, a webhook), none able to hold up the others.

`MultiNotifier` sends each notification to every notifier concurrently, each bounded by
its own timeout and isolated from the others' failures: a hung webhook neither delays nor
loses the Slack message. `WebhookNotifier` POSTs the notification as JSON to any URL
(a pager, a chat bridge, an audit log), signed like Slack signs its requests when a
secret is set, so the receiver can check it came from us:

    X-AutoClusters-Timestamp: <unix seconds>
    X-AutoClusters-Signature: v0=<hex HMAC-SHA256 of "v0:<timestamp>:<raw body>">

Both belong with `autoclusters.integrations.notify` once that module may change; they live here
meanwhile, beside the Slack notifier they are used with.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Sequence

import httpx

from autoclusters.core.models import Notification
from autoclusters.integrations.notify import Notifier

__all__ = ["MultiNotifier", "WebhookNotifier", "webhook_signature"]

log = logging.getLogger("autoclusters.integrations.notify")


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


class WebhookNotifier:
    """POSTs each notification as JSON (the `Notification` fields) to `url`.

    Never raises: a refused, failed or slow POST is logged after at most `timeout_s`.
    `client` is shared and owned by the caller (its own timeout still applies).
    """

    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        url: str,
        secret: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self._client = client
        self._url = url
        self._secret = secret
        self._timeout_s = timeout_s

    async def send(self, note: Notification) -> None:
        body = json.dumps(note.model_dump(mode="json"), separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"}
        if self._secret:
            ts = str(int(time.time()))
            headers["X-AutoClusters-Timestamp"] = ts
            headers["X-AutoClusters-Signature"] = webhook_signature(self._secret, ts, body)
        try:
            async with asyncio.timeout(self._timeout_s):
                resp = await self._client.post(self._url, content=body, headers=headers)
            if resp.status_code >= 300:
                log.warning(
                    "webhook: %s of %s refused: HTTP %s",
                    note.event, note.incident_id, resp.status_code,
                )  # fmt: skip
        except (TimeoutError, httpx.HTTPError) as e:
            log.warning(
                "webhook: %s of %s not sent: %s: %s",
                note.event, note.incident_id, type(e).__name__, e,
            )  # fmt: skip


class MultiNotifier:
    """Sends to every notifier concurrently; one failing or hanging never stops another.

    `timeout_s` bounds each notifier (None: trust each to bound itself).
    """

    def __init__(self, notifiers: Sequence[Notifier], *, timeout_s: float | None = 20.0) -> None:
        self._notifiers = list(notifiers)
        self._timeout_s = timeout_s

    async def send(self, note: Notification) -> None:
        await asyncio.gather(*(self._one(n, note) for n in self._notifiers))

    async def _one(self, notifier: Notifier, note: Notification) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await notifier.send(note)
        except Exception as e:  # noqa: BLE001 - one notifier must not silence the others
            log.warning(
                "%s: %s of %s not sent: %s: %s",
                type(notifier).__name__, note.event, note.incident_id, type(e).__name__, e,
            )  # fmt: skip
