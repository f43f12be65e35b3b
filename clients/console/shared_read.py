"""One read of the cluster for every viewer: stale-while-revalidate, with a bounded age.

Each open console page polls every 2 s. Reading the cluster once per poll made N viewers
cost N `sinfo` calls through slurmctld (which also schedules the jobs) and N rounds of
Temporal queries. Here one background loop reads every `fresh_s` for as long as someone is
looking (asked within `idle_s`), and every request is answered at once from the last read:

- **A slow read never holds a page.** Requests never wait for a read in flight, except
  the very first (nothing to show yet), and that wait is bounded by `timeout_s`.
- **The age is bounded and said.** A read starts `fresh_s` after the previous one
  started, so what a page gets is at most `fresh_s` plus one read's duration old. A read
  slower than `timeout_s` is abandoned (and the next one starts), so a hung sinfo cannot
  keep the data old for ever; a failed read keeps the last value. Every answer carries its
  age (`Snapshot.age_s`) and whether it is past `max_age_s` (`stale`): the page shows it.
- **Nobody looking, no reads.** The loop stops after `idle_s` without a request and drops
  its value, so a viewer arriving later waits for a fresh read rather than seeing one
  from an hour ago.

An earlier version (reverted, 619291d) made every request in a window wait for the read
in flight: under load a slow read held every page, and the data a page showed was a
read's duration plus the window old, with nothing saying so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class ReadUnavailable(Exception):
    """No read has succeeded yet and the first did not answer in time."""


@dataclass(frozen=True)
class Snapshot(Generic[T]):
    value: T
    seq: int  # which read this is: 1, 2, ... (an ETag for it)
    started: float  # the clock when the read started: what it shows is at least that old
    read_at: datetime  # the same, as a time of day
    took_s: float
    age_s: float = 0.0  # how old at the answer (set per answer)
    stale: bool = False  # older than max_age_s
    last_error: str = ""  # the latest read failed: why (the value is an earlier read's)


class SharedRead(Generic[T]):
    def __init__(
        self,
        read: Callable[[], Awaitable[T]],
        *,
        fresh_s: float,
        max_age_s: float,
        timeout_s: float,
        idle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < fresh_s <= max_age_s:
            raise ValueError(f"fresh_s ({fresh_s}) must be > 0 and <= max_age_s ({max_age_s})")
        self._read = read
        self.fresh_s = fresh_s
        self.max_age_s = max_age_s
        self.timeout_s = timeout_s
        self.idle_s = max(idle_s, fresh_s)
        self._clock = clock
        self._snap: Snapshot[T] | None = None
        self._error = ""
        self._asked = 0.0
        self._seq = 0
        self._loop: asyncio.Task[None] | None = None
        self._first: asyncio.Event = asyncio.Event()
        self._last_start = float("-inf")  # when the latest read began, whichever loop ran it
        self.reads = 0  # reads started (the benchmark and tests count them)

    def latest(self) -> Snapshot[T] | None:
        """The last successful read, without asking for a new one."""
        return self._snap

    async def get(self) -> Snapshot[T]:
        """The last read, aged; starts the reading loop if nobody was looking."""
        self._asked = self._clock()
        running = asyncio.get_running_loop()
        # A loop task of another event loop (a test client's, since closed) never runs again.
        if self._loop is None or self._loop.done() or self._loop.get_loop() is not running:
            self._first = asyncio.Event()
            self._loop = asyncio.create_task(self._run(), name="console-shared-read")
        if self._snap is None:
            try:
                await asyncio.wait_for(self._first.wait(), self.timeout_s)
            except TimeoutError:
                pass
        snap = self._snap
        if snap is None:
            raise ReadUnavailable(self._error or f"no answer within {self.timeout_s:g} s")
        age = max(0.0, self._clock() - snap.started)
        return Snapshot(
            value=snap.value,
            seq=snap.seq,
            started=snap.started,
            read_at=snap.read_at,
            took_s=snap.took_s,
            age_s=age,
            stale=age > self.max_age_s,
            last_error=self._error,
        )

    async def _run(self) -> None:
        try:
            while self._clock() - self._asked < self.idle_s:
                # A read starts fresh_s after the latest one began, whichever loop began it:
                # a loop started again (the last one was stopped, or ran in an event loop
                # since closed) never reads sooner, and two loops never double the reads
                # (ci21: 47 reads in 2.3 s for a 0.25 s interval).
                wait = self._last_start + self.fresh_s - self._clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                started = self._last_start = self._clock()
                await self._read_once(started)
                self._first.set()
        finally:
            # Nobody looking: forget the value, so a later viewer gets a fresh read rather
            # than one from before the pause.
            self._snap = None
            self._first.set()

    async def _read_once(self, started: float) -> None:
        self.reads += 1
        read_at = datetime.now(UTC)
        try:
            value = await asyncio.wait_for(self._read(), self.timeout_s)
        except TimeoutError:
            self._error = f"the cluster read took longer than {self.timeout_s:g} s"
            log.warning("console: %s", self._error)
            return
        except Exception as e:  # the last value stays, and the answer says why it ages
            self._error = f"the cluster read failed: {str(e) or type(e).__name__}"
            log.warning("console: %s", self._error)
            return
        self._seq += 1
        self._error = ""
        took = self._clock() - started
        self._snap = Snapshot(value=value, seq=self._seq, started=started, read_at=read_at,
                              took_s=took)  # fmt: skip

    async def aclose(self) -> None:
        """Stop the loop now (tests; the loop ends by itself when nobody looks)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
