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
import contextlib
from types import TracebackType
from typing import Any

from temporalio.client import WorkflowHandle

# The history cannot be read (the Temporal server is away): try again after this, and wake
# the watcher meanwhile, which has its own way of waiting out an outage.
RETRY_S = 0.2


class HistoryTicks:
    """`async with HistoryTicks(handle) as ticks:` then `await ticks.wait(timeout_s)`
    returns True at the next new event of the run's history (at once if one came since the
    last wait), False after `timeout_s` without one."""

    def __init__(self, handle: WorkflowHandle[Any, Any]) -> None:
        self.handle = handle
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HistoryTicks:
        self._task = asyncio.create_task(self._follow())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @property
    def following(self) -> bool:
        """False once the run has closed (its last event seen)."""
        return self._task is not None and not self._task.done()

    async def wait(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    async def _follow(self) -> None:
        while True:
            try:
                # From the start again after an outage (a page token may not outlive the
                # server that gave it): a few hundred events, each one more wake-up at most.
                async for _ in self.handle.fetch_history_events(wait_new_event=True):
                    self._event.set()
                return  # the run closed: its last event has been seen
            except asyncio.CancelledError:
                raise
            except Exception:  # the server is away
                self._event.set()
                await asyncio.sleep(RETRY_S)
