"""Watches: every change the store commits, as the API server's watch events.

The store publishes each write (ADDED, MODIFIED, DELETED with the object as written, at its
new resourceVersion) to a `Hub`; a watch subscribes from a resourceVersion and gets the
kept history after it, then live events, without a gap: both happen under the store's lock.
A resourceVersion older than the kept history is answered with an ERROR event carrying a
410 `Expired` Status, as the API server does once etcd has compacted it, and the client
lists again.

Writes happen on any thread (the event loop, or a test calling the store directly), so a
subscriber's queue is fed through its own loop's `call_soon_threadsafe`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from autoclusters.sandbox.kubernetes.objects import Kind, Obj

KEPT = 5000  # events kept for watches that resume from a resourceVersion


@dataclass(frozen=True)
class Event:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    kind: Kind
    obj: Obj  # as clients read it (kind and apiVersion included)


@dataclass(eq=False)
class Subscription:
    kind: Kind
    loop: asyncio.AbstractEventLoop
    # None: the server is stopping and the watch ends (clients then list and watch again).
    queue: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    closed: bool = False

    def offer(self, event: Event) -> None:
        if event.kind is self.kind and not self.closed:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


class Expired(Exception):
    """The resourceVersion asked for is older than the history kept."""


class Hub:
    def __init__(self) -> None:
        self._log: deque[Event] = deque(maxlen=KEPT)
        self._subs: set[Subscription] = set()
        self._oldest = 0  # watches from a resourceVersion below this have missed events

    def publish(self, event: Event) -> None:
        """Called under the store's lock, in commit order."""
        if len(self._log) == self._log.maxlen:
            self._oldest = self._log[0].rv
        self._log.append(event)
        for sub in list(self._subs):
            sub.offer(event)

    def subscribe(self, kind: Kind, since: int, loop: asyncio.AbstractEventLoop) -> Subscription:
        """Under the store's lock: the events after `since`, then every later one."""
        if since < self._oldest:
            raise Expired(f"too old resource version: {since} ({self._oldest})")
        sub = Subscription(kind, loop)
        for event in self._log:
            if event.rv > since:
                sub.offer(event)
        self._subs.add(sub)
        return sub

    def close_all(self) -> None:
        """The server stops: every open watch ends now rather than holding the stop up."""
        for sub in list(self._subs):
            sub.loop.call_soon_threadsafe(sub.queue.put_nowait, None)
            self.unsubscribe(sub)

    def unsubscribe(self, sub: Subscription) -> None:
        sub.closed = True
        self._subs.discard(sub)
