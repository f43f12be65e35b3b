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
# The events that close an activity (each names the event that scheduled it).
_ACTIVITY_CLOSED = (
    "activity_task_completed_event_attributes",
    "activity_task_failed_event_attributes",
    "activity_task_timed_out_event_attributes",
    "activity_task_canceled_event_attributes",
)


class HistoryTicks(Wakeups):
    """`async with HistoryTicks(handle) as ticks:` then `await ticks.wait(timeout_s)`
    returns True at the next new event of the run's history (at once if one came since the
    last wait), False after `timeout_s` without one; `following` is False once the run has
    closed. `running(activity_type)`: whether the history has an activity of that type
    scheduled and not yet closed."""

    def __init__(self, handle: WorkflowHandle[Any, Any]) -> None:
        super().__init__()
        self.handle = handle
        self._open: dict[int, str] = {}  # scheduled event id -> activity type, not closed

    def followers(self) -> list[Coroutine[Any, Any, None]]:
        return [self._follow()]

    def running(self, activity_type: str) -> bool:
        """A short step's activity is seen here as soon as the server has scheduled it,
        before a worker has taken it; a query of the workflow (answered by a worker) may
        come back after the activity is over."""
        return activity_type in self._open.values()

    def _note(self, event: HistoryEvent) -> None:
        kind = event.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            attrs = event.activity_task_scheduled_event_attributes
            self._open[event.event_id] = attrs.activity_type.name
        elif kind in _ACTIVITY_CLOSED:
            self._open.pop(getattr(event, kind).scheduled_event_id, None)

    async def _follow(self) -> None:
        while True:
            try:
                # From the start again after an outage (a page token may not outlive the
                # server that gave it): a few hundred events, each one more wake-up at most.
                self._open.clear()
                async for event in self.handle.fetch_history_events(wait_new_event=True):
                    self._note(event)
                    self.wake()
                return  # the run closed: its last event has been seen
            except asyncio.CancelledError:
                raise
            except Exception:  # the server is away
                self.wake()
                await asyncio.sleep(RETRY_S)
