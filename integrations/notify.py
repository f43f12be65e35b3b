"""Notifiers: where an incident's story is told. Console/log for now; Slack later."""

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
