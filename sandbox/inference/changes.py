"""Wake a loop when a watched list changes, as an informer does, instead of listing it again
every fraction of a second.

The inference kubelet and gateway act on the pods (and nodes) the emulated API holds. They
used to list them five times a second each, which the API emulator answered: in a test run
with several Kubernetes-mode sandboxes alive, those polls were a tenth of the suite's CPU
(docs/testing.md). Each now holds one watch per list (`?watch=true`: the emulator streams
every change) and does a pass when an event arrives, or after `resync_s` without one: a
change the watch missed while it was reconnecting, or one that is not in the API at all (an
inference server that died), is still seen within that time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import Any

import httpx

from autoclusters.sandbox.runtime.wakeups import Wakeups

log = logging.getLogger(__name__)
# A watch that failed to open (the API emulator restarting) is tried again after this.
RECONNECT_S = 1.0


class Changes(Wakeups):
    """`async with Changes(k8s, {"/api/v1/pods": {"labelSelector": ...}}) as changes:`
    then `await changes.wait(resync_s)` returns True at the next event of any of the
    watches (or at once if one came since the last wait), False after `resync_s`."""

    def __init__(self, k8s: httpx.AsyncClient, lists: Mapping[str, Mapping[str, str]]) -> None:
        super().__init__()
        self.k8s, self.lists = k8s, lists

    def followers(self) -> list[Coroutine[Any, Any, None]]:
        return [self._watch(path, dict(params)) for path, params in self.lists.items()]

    async def _watch(self, path: str, params: dict[str, str]) -> None:
        # No read timeout: an idle watch is quiet for as long as nothing changes.
        timeout = httpx.Timeout(10.0, read=None)
        while True:
            try:
                async with self.k8s.stream(
                    "GET", path, params={**params, "watch": "true"}, timeout=timeout
                ) as r:
                    r.raise_for_status()
                    async for _ in _lines(r):
                        self.wake()
            except httpx.HTTPError as e:
                log.debug("watch %s: %s; again in %.0fs", path, e, RECONNECT_S)
            # Ended or failed: whatever changed meanwhile is read by the pass this forces.
            self.wake()
            await asyncio.sleep(RECONNECT_S)


async def _lines(r: httpx.Response) -> AsyncIterator[str]:
    async for line in r.aiter_lines():
        if line.strip():
            yield line
