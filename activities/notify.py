"""Notify step: tell the humans what the incident is doing."""

from __future__ import annotations

from temporalio import activity

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.models import Notification
from autoclusters.integrations.notify import Notifier


class NotifyActivities:
    def __init__(self, notifiers: list[Notifier]) -> None:
        self._notifiers = notifiers

    @activity.defn(name="notify")
    async def notify(self, note: Notification) -> None:
        async with heartbeating(f"notify {note.event}"):
            for n in self._notifiers:
                await n.send(note)
