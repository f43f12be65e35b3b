"""Wake a watcher of an incident at each new event of its workflow's history.

The chaos and outage drivers act when an incident reaches a step, and a short step is over
in tens of milliseconds. They used to query the workflow every 20 ms to catch it, which
kept the dev server and the worker busy for the whole incident (a query goes through both).
A workflow's state only changes in a workflow task, and every workflow task ends in an
event of its history, so one long poll of the history (`wait_new_event`) tells them when to
query: at once after each change, and not otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHandle

from autoclusters.sandbox.runtime.wakeups import Wakeups

# The history cannot be read (the Temporal server is away): try again after this, and wake
# the watcher meanwhile, which has its own way of waiting out an outage.
RETRY_S = 0.2


class HistoryTicks(Wakeups):
    """`async with HistoryTicks(handle) as ticks:` then `await ticks.wait(timeout_s)`
    returns True at the next new event of the run's history (at once if one came since the
    last wait), False after `timeout_s` without one; `following` is False once the run has
    closed. `await scheduled(activity_type)`: returns as soon as the history has an activity
    of that type scheduled (at once if it had), closed since or not."""

    def __init__(self, handle: WorkflowHandle[Any, Any]) -> None:
        super().__init__()
        self.handle = handle
        self._scheduled: dict[str, asyncio.Event] = {}  # activity type -> one was scheduled

    async def scheduled(self, activity_type: str) -> None:
        """For a watcher that must act within the step: a short activity is scheduled and
        closed within tens of ms, while a watcher busy elsewhere (a query that a loaded
        worker answers in seconds) would look at `running` only after it closed."""
        await self._scheduled.setdefault(activity_type, asyncio.Event()).wait()

    def followers(self) -> list[Coroutine[Any, Any, None]]:
        return [self._follow()]

    def _note(self, event: HistoryEvent) -> None:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            self._scheduled.setdefault(attrs.activity_type.name, asyncio.Event()).set()

    async def _follow(self) -> None:
        while True:
            try:
                # From the start again after an outage (a page token may not outlive the
                # server that gave it): a few hundred events, each one more wake-up at most.
                async for event in self.handle.fetch_history_events(wait_new_event=True):
                    self._note(event)
                    self.wake()
                return  # the run closed: its last event has been seen
            except asyncio.CancelledError:
                raise
            except Exception:  # the server is away
                self.wake()
                await asyncio.sleep(RETRY_S)
