"""uvicorn's server, asleep while nothing happens: the API and the sandbox's emulators.

uvicorn's own `Server.main_loop` wakes every 0.1 s to refresh the Date header (once a
second) and to see `should_exit`. A sandbox runs half a dozen such servers for the whole of
a test run, and those ten wake-ups a second were most of an idle emulator's CPU (issue 41).
`QuietServer` ticks once a second (the Date header's own resolution, refreshed each tick)
and is woken at once when `should_exit` is set, by a signal or by another thread, so a stop
is no slower than uvicorn's.

Example:
    serve(app, host="127.0.0.1", port=8480, log_level="warning")
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

import uvicorn

TICK_S = 1.0
# uvicorn's on_tick refreshes the Date header when counter % 10 == 0 (its ticks are 0.1 s):
# each of ours is a second, so each counts as ten.
_COUNTS_PER_TICK = 10
_COUNTER_WRAP = 864000  # uvicorn's own
STARTUP_FAILURE = 3  # uvicorn.run's exit status when the server did not start


class QuietServer(uvicorn.Server):
    """A uvicorn.Server that ticks every TICK_S, and at once when `should_exit` is set."""

    def __init__(self, config: uvicorn.Config) -> None:
        self._exit_asked = False  # before the base's __init__, which sets should_exit
        self._loop: asyncio.AbstractEventLoop | None = None
        self._woken: asyncio.Event | None = None
        self._exiting: asyncio.Event | None = None
        super().__init__(config)

    @property  # uvicorn's plain attribute, with a wake-up when set
    def should_exit(self) -> bool:
        return self._exit_asked

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_asked = value
        if value:
            self._wake()

    def _wake(self) -> None:
        # From any thread, or a signal handler: the loop's own thread then sets the events.
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # not in main_loop yet: its first tick sees the flag
        with contextlib.suppress(RuntimeError):  # the loop closed in between
            loop.call_soon_threadsafe(self._set_exiting)

    def _set_exiting(self) -> None:
        for event in (self._woken, self._exiting):
            if event is not None:
                event.set()

    async def exiting(self) -> None:
        """Returns once `should_exit` is set (for what must end before the graceful
        shutdown can: open watches)."""
        if self._exiting is None:
            self._exiting = asyncio.Event()
        if not self.should_exit:
            await self._exiting.wait()

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        if self._exiting is None:
            self._exiting = asyncio.Event()
        self._loop = asyncio.get_running_loop()  # after the events: `_wake` may set them now
        if self.should_exit:  # asked before there was a loop to wake
            self._set_exiting()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), TICK_S)
            counter = (counter + _COUNTS_PER_TICK) % _COUNTER_WRAP
            should_exit = await self.on_tick(counter)


def serve(app: Any, **config: Any) -> None:
    """`uvicorn.run(app, **config)` with a QuietServer (one process, no reload)."""
    server = QuietServer(uvicorn.Config(app, **config))
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)
