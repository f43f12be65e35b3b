"""One read of the cluster for every console viewer within a short window.

Each open topology page polls its JSON; a node page reads the topology too. Without this,
N viewers cost N reads of Slurm (sinfo through slurmctld, which also schedules the jobs),
Temporal and the policy per poll. `Coalesced.get` answers every caller within `ttl_s` of
the last read from that read, and callers that arrive while a read is in flight wait for
it instead of starting their own: slurmctld sees at most one console read per `ttl_s`
however many people watch. `ttl_s` 0 still coalesces concurrent callers, caching nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalesced(Generic[T]):
    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._value: tuple[float, T] | None = None
        self._inflight: asyncio.Future[T] | None = None

    async def get(self, read: Callable[[], Awaitable[T]]) -> T:
        if self._value is not None and self._clock() - self._value[0] < self.ttl_s:
            return self._value[1]
        if self._inflight is None:
            self._inflight = asyncio.ensure_future(self._read(read))
        # Shielded: one caller going away (a closed page) does not cancel the others' read.
        return await asyncio.shield(self._inflight)

    async def _read(self, read: Callable[[], Awaitable[T]]) -> T:
        started = self._clock()
        try:
            value = await read()
        finally:
            self._inflight = None
        # Aged from when the read started: what it shows is at least that old.
        self._value = (started, value)
        return value
