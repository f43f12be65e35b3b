"""A loop that waits for "something changed" instead of polling on a short timer.

Background tasks follow a source (a Kubernetes watch, a workflow's history) and `wake()` the
loop at each change; the loop's `wait(timeout_s)` returns True at the next change (at once if
one came since its last wait), False after `timeout_s` without one, so it still looks at
least that often. Used as `async with`: the followers start on entry and are cancelled on
exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self


class Wakeups(ABC):
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    @abstractmethod
    def followers(self) -> list[Coroutine[Any, Any, None]]:
        """What follows the source; each calls `wake()` at a change."""

    def wake(self) -> None:
        self._event.set()

    @property
    def following(self) -> bool:
        """False once every follower has ended (its source closed)."""
        return any(not task.done() for task in self._tasks)

    async def wait(self, timeout_s: float) -> bool:
        try:
            await asyncio.wait_for(self._event.wait(), timeout_s)
        except TimeoutError:
            return False
        self._event.clear()
        return True

    async def __aenter__(self) -> Self:
        self._tasks = [asyncio.create_task(c) for c in self.followers()]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
