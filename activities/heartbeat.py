"""Heartbeats for activities that can outlive a few seconds.

A worker that dies mid-activity is noticed only when the activity's heartbeat stops; the
workflow gives each such activity a heartbeat timeout of at most 10 s, so the retry starts
on another worker within seconds instead of after the start-to-close timeout. A slow call
(a Slurm command, a Kubernetes request, the fleet guard's update) blocks no beat: the beats
run beside it on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from temporalio import activity

# Beats are throttled by the SDK to 80% of the heartbeat timeout anyway; every 2 s keeps a
# 10 s timeout comfortably fed.
BEAT_S = 2.0


@contextlib.asynccontextmanager
async def heartbeating(what: Any, every_s: float = BEAT_S) -> AsyncIterator[None]:
    """Heartbeat `what` every `every_s` while the block runs (a no-op outside an activity).
    A callable `what` is called at each beat: its progress so far, for a retry to read."""
    if not activity.in_activity():
        yield
        return

    async def beat() -> None:
        while True:
            activity.heartbeat(what() if callable(what) else what)
            await asyncio.sleep(every_s)

    beater = asyncio.create_task(beat())
    try:
        yield
    finally:
        beater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beater
