"""Alerts already accepted (or being accepted): Alertmanager retries on 5xx and re-sends a
firing alert every repeat_interval, the agent retries a report it got no answer for.

One entry per alert key (fingerprint + startsAt, or the agent's report_id) holding the
future of its delivery: a repeat while the first is in flight waits on the same future, a
repeat after it succeeded is answered from here. A failed delivery forgets its key, so
the retry delivers again. The store is per process and bounded; Temporal itself answers a
repeated update id with the first answer, and the workflow merges repeated faults, so a
repeat that slips past (another replica, a restart) joins the incident, never a second one.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class Claim(Generic[T]):
    future: asyncio.Future[T]
    new: bool  # True: the caller must deliver and settle it; False: a repeat


class DedupeStore(Generic[T]):
    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self._ttl_s = ttl_s
        self._max = max_entries
        self._entries: OrderedDict[str, tuple[float, asyncio.Future[T]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def claim(self, key: str) -> Claim[T]:
        now = time.monotonic()
        entry = self._entries.get(key)
        if entry is not None:
            at, fut = entry
            if not fut.done() or now - at <= self._ttl_s:
                self._entries.move_to_end(key)
                return Claim(fut, new=False)
        fut = asyncio.get_running_loop().create_future()
        self._entries[key] = (now, fut)
        self._entries.move_to_end(key)
        self._trim(now)
        return Claim(fut, new=True)

    def settle(self, key: str, fut: asyncio.Future[T], result: T) -> None:
        if not fut.done():
            fut.set_result(result)
        entry = self._entries.get(key)
        if entry is not None and entry[1] is fut:  # the TTL runs from acceptance
            self._entries[key] = (time.monotonic(), fut)
            self._entries.move_to_end(key)

    def fail(self, key: str, fut: asyncio.Future[T], error: BaseException) -> None:
        if not fut.done():
            fut.set_exception(error)
            fut.exception()  # retrieved: a repeat that gave up waiting is not an error
        entry = self._entries.get(key)
        if entry is not None and entry[1] is fut:
            del self._entries[key]

    def _trim(self, now: float) -> None:
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
        # Expired entries sit at the old end (claims and settles move keys to the new end).
        while self._entries:
            key, (at, fut) = next(iter(self._entries.items()))
            if not fut.done() or now - at <= self._ttl_s:
                break
            del self._entries[key]
