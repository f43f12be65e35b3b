"""SlackNotifier: each incident is one message in the channel, and its thread is the story.

The first event posts the incident's message (node, cluster, fault, planned repair,
state, links to the workflow and to the incident); every event then updates that message
in place (`chat.update`) and adds itself as a thread reply, so the thread reads in order.
While a step waits for approval the message carries Approve / Reject buttons. A critical
event mentions the paging user group, and its reply is broadcast to the channel.

Invariant: Slack never blocks or fails a remediation. `send` returns within
`send_timeout_s` whatever Slack does (errors, 5xx, 429 with a long Retry-After, a hung
connection, no route); what could not be told is logged, and the next event's update
brings the message up to date again.

The message's (channel, ts) survives restarts and is shared by workers through the
`ThreadStore`; a worker whose store has no record finds the message in the channel
history by its metadata (`autoclusters_incident` / incident_id) before posting a new one.

What it sends is built by `cards` from `escape`: the words of an event (an alert's
annotations, a Slurm reason, a node's name) arrive as words, never as a mention or a link.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import weakref
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from autoclusters.core.models import Notification
from autoclusters.core.slack_config import SlackConfig
from autoclusters.integrations.slack.cards import (
    METADATA_EVENT_TYPE,
    IncidentCard,
    Links,
    card_message,
    card_metadata,
    event_text,
)
from autoclusters.integrations.slack.client import web_client_for
from autoclusters.integrations.slack.escape import message_text
from autoclusters.integrations.slack.store import (
    FileThreadStore,
    MemoryThreadStore,
    ThreadRecord,
    ThreadStore,
)

__all__ = ["SlackNotifier"]

log = logging.getLogger("autoclusters.integrations.slack")

# What became of one event: sent, duplicate (already in the thread), timeout, slack_error,
# error, cancelled. The worker counts them (workers/metrics.py); called with (event, outcome).
DeliveryCallback = Callable[[str, str], None]


class SlackNotifier:
    """A `Notifier` that keeps one Slack message and thread per incident.

    Example:
        notifier = SlackNotifier(
            client=slack_web_client(token=..., base_url=...),
            channel="C0123456789",
            store=FileThreadStore(Path("/var/lib/autoclusters/slack")),
            links=Links(temporal_ui_url="http://temporal:8233", api_url="http://api:8000"),
            page_group_id="S0PAGERS",
        )
        await notifier.send(note)
    """

    def __init__(
        self,
        *,
        client: AsyncWebClient,
        channel: str,
        store: ThreadStore | None = None,
        links: Links | None = None,
        page_group_id: str | None = None,
        send_timeout_s: float = 10.0,
        history_lookup: bool = True,
        history_pages: int = 3,
        on_delivery: DeliveryCallback | None = None,
    ) -> None:
        self._client = client
        self._channel = channel
        self._store: ThreadStore = store if store is not None else MemoryThreadStore()
        self._links = links or Links()
        self._page_group_id = page_group_id
        self._send_timeout_s = send_timeout_s
        self._history_lookup = history_lookup
        self._history_pages = history_pages
        self._on_delivery = on_delivery
        # One event at a time per incident in this process; gone once nobody holds it.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock]
        self._locks = weakref.WeakValueDictionary()

    @classmethod
    def from_config(
        cls, config: SlackConfig, *, on_delivery: DeliveryCallback | None = None
    ) -> SlackNotifier:
        store: ThreadStore = (
            FileThreadStore(config.store_dir) if config.store_dir else MemoryThreadStore()
        )
        return cls(
            client=web_client_for(config),
            channel=config.channel,
            store=store,
            links=Links(
                temporal_ui_url=config.temporal_ui_url,
                temporal_namespace=config.temporal_namespace,
                api_url=config.api_url,
            ),
            page_group_id=config.page_group_id,
            send_timeout_s=config.send_timeout_s,
            history_lookup=config.history_lookup,
            on_delivery=on_delivery,
        )

    async def send(self, note: Notification) -> None:
        """Tell the channel; never raises for a Slack failure, never takes longer than
        `send_timeout_s` (a cancellation of the caller still propagates)."""
        lock = self._locks.get(note.incident_id)
        if lock is None:
            lock = self._locks[note.incident_id] = asyncio.Lock()
        outcome = "error"
        try:
            async with asyncio.timeout(self._send_timeout_s):
                async with lock:
                    outcome = await self._tell(note)
        except TimeoutError:
            outcome = "timeout"
            log.warning(
                "Slack: %s of %s not told: timed out (bound %.1fs)",
                note.event, note.incident_id, self._send_timeout_s,
            )  # fmt: skip
        except SlackApiError as e:
            outcome = "slack_error"
            log.warning(
                "Slack: %s of %s not told: %s (HTTP %s)",
                note.event, note.incident_id, _error(e), e.response.status_code,
            )  # fmt: skip
        except asyncio.CancelledError:
            outcome = "cancelled"  # the caller's cancellation: it still propagates
            raise
        except Exception as e:  # noqa: BLE001 - Slack must never fail the remediation
            log.warning(
                "Slack: %s of %s not told: %s: %s",
                note.event, note.incident_id, type(e).__name__, e,
            )  # fmt: skip
        finally:
            if self._on_delivery is not None:
                self._on_delivery(note.event, outcome)

    async def _tell(self, note: Notification) -> str:
        """Post or update the incident's message and reply; returns the outcome."""
        rec = self._store.get(note.incident_id) or await self._find_in_history(note)
        key = _event_key(note)
        if rec is not None and rec.last_event_key == key:
            return "duplicate"  # a retried activity: this event is in the thread already
        card = (rec.card if rec else IncidentCard.for_note(note)).apply(note)
        # Escaped and cut to Slack's limits in the card (integrations/slack/escape.py).
        markup, blocks = card_message(card, self._links, page_group_id=self._page_group_id)
        text = message_text(markup)
        metadata = card_metadata(card)
        if rec is not None:
            try:
                await self._client.chat_update(
                    channel=rec.channel, ts=rec.ts, text=text, blocks=blocks, metadata=metadata
                )
            except SlackApiError as e:
                if _error(e) != "message_not_found":
                    raise
                log.warning("Slack: message of %s was deleted; posting anew", note.incident_id)
                rec = None
        if rec is None:
            resp = await self._client.chat_postMessage(
                channel=self._channel,
                text=text,
                blocks=blocks,
                metadata=metadata,
                unfurl_links=False,
                unfurl_media=False,
            )
            rec = ThreadRecord(
                incident_id=note.incident_id,
                channel=str(resp["channel"]),
                ts=str(resp["ts"]),
                card=card,
            )
        rec.card = card
        self._store.put(rec)  # the message is known before the reply is tried
        await self._client.chat_postMessage(
            channel=rec.channel,
            thread_ts=rec.ts,
            text=message_text(event_text(note, page_group_id=self._page_group_id)),
            # A page must be seen in the channel, not only inside the thread.
            reply_broadcast=note.severity == "critical",
            unfurl_links=False,
            unfurl_media=False,
        )
        rec.last_event_key = key
        self._store.put(rec)
        return "sent"

    async def _find_in_history(self, note: Notification) -> ThreadRecord | None:
        """The incident's message from the channel history, by its metadata."""
        if not self._history_lookup:
            return None
        cursor: str | None = None
        for _ in range(self._history_pages):
            try:
                resp = await self._client.conversations_history(
                    channel=self._channel, limit=200, include_all_metadata=True, cursor=cursor
                )
            except SlackApiError as e:
                log.info("Slack: history look-up for %s failed: %s", note.incident_id, _error(e))
                return None
            for msg in resp.get("messages") or []:
                rec = _record_from_message(note.incident_id, self._channel, msg)
                if rec is not None:
                    return rec
            cursor = (resp.get("response_metadata") or {}).get("next_cursor") or None
            if not resp.get("has_more") or not cursor:
                return None
        return None


def _record_from_message(
    incident_id: str, channel: str, msg: dict[str, Any]
) -> ThreadRecord | None:
    md = msg.get("metadata") or {}
    payload = md.get("event_payload") or {}
    if md.get("event_type") != METADATA_EVENT_TYPE or payload.get("incident_id") != incident_id:
        return None
    card = IncidentCard(
        incident_id=incident_id,
        cluster=str(payload.get("cluster", "")),
        node=str(payload.get("node", "")),
        fault=str(payload.get("fault", "")),
        rung=payload.get("rung") or None,
        event=str(payload.get("event", "opened")),
        severity=str(payload.get("severity", "info")),
        text=str(msg.get("text", "")),
        updated_at=datetime.now(UTC),
    )
    return ThreadRecord(incident_id=incident_id, channel=channel, ts=str(msg["ts"]), card=card)


def _event_key(note: Notification) -> str:
    return hashlib.sha256(f"{note.event}\n{note.severity}\n{note.text}".encode()).hexdigest()[:24]


def _error(e: SlackApiError) -> str:
    data = e.response.data if isinstance(e.response.data, dict) else {}
    return str(data.get("error") or f"HTTP {e.response.status_code}")
