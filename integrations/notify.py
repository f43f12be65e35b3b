"""Notifiers: where an incident's story is told. The log notifier is here; Slack's is in
integrations/slack/ (notifier.py, and fanout.py to send to several at once)."""

from __future__ import annotations

import logging
from typing import Protocol

from autoclusters.core.models import Notification


class Notifier(Protocol):
    async def send(self, note: Notification) -> None: ...


class LogNotifier:
    """Writes each notification as one log line (the worker's log is the incident channel)."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or logging.getLogger("autoclusters.incident")

    async def send(self, note: Notification) -> None:
        self._log.info(
            "[%s] %s %s %s: %s", note.incident_id, note.event, note.node, note.fault, note.text
        )
