"""The console's topology read is shared: many viewers, one read of Slurm per window."""

from __future__ import annotations

import asyncio

import pytest

from autoclusters.clients.api.settings import ApiSettings
from autoclusters.clients.console.coalesce import Coalesced
from autoclusters.clients.console.routes import Console
from autoclusters.core.models import SlurmNode
from tests.test_console import FakeSource, app_for, settings


class CountingSource(FakeSource):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def slurm_nodes(self) -> list[SlurmNode]:
        self.reads += 1
        await self.gate.wait()  # held open to let viewers pile up behind one read
        return await super().slurm_nodes()


def _console(s: ApiSettings) -> tuple[Console, CountingSource]:
    app, _ = app_for(s)
    console: Console = app.state.console
    source = CountingSource()
    console.source = source
    return console, source


async def test_viewers_arriving_during_a_read_share_it() -> None:
    console, source = _console(settings())
    source.gate.clear()
    viewers = [asyncio.ensure_future(console.topology()) for _ in range(20)]
    await asyncio.sleep(0)  # every viewer has asked (one event-loop turn, not a wait)
    source.gate.set()
    views = await asyncio.gather(*viewers)
    assert source.reads == 1
    assert all(v == views[0] for v in views)
    assert sum(len(g.tiles) for p in views[0].pods for lf in p.leaves for g in lf.groups) == 5


async def test_a_read_serves_the_window_then_the_next_viewer_reads_again() -> None:
    now = [100.0]
    cache: Coalesced[int] = Coalesced(2.0, clock=lambda: now[0])
    reads = 0

    async def read() -> int:
        nonlocal reads
        reads += 1
        return reads

    assert await cache.get(read) == 1
    now[0] += 1.9
    assert await cache.get(read) == 1
    now[0] += 0.2
    assert await cache.get(read) == 2 and reads == 2


async def test_with_no_window_every_sequential_viewer_reads() -> None:
    console, source = _console(settings(console_cache_s=0))
    await console.topology()
    await console.topology()
    assert source.reads == 2


async def test_a_failed_read_reaches_every_waiter_and_is_not_kept() -> None:
    cache: Coalesced[int] = Coalesced(60.0)
    release = asyncio.Event()
    calls = 0

    async def failing() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        raise RuntimeError("slurmctld down")

    waiters = [asyncio.ensure_future(cache.get(failing)) for _ in range(3)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiters, return_exceptions=True)
    assert calls == 1 and all(isinstance(r, RuntimeError) for r in results)

    async def ok() -> int:
        return 7

    assert await cache.get(ok) == 7  # the failure was not cached


async def test_a_viewer_leaving_does_not_cancel_the_others_read() -> None:
    cache: Coalesced[str] = Coalesced(60.0)
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "view"

    leaving = asyncio.ensure_future(cache.get(slow))
    staying = asyncio.ensure_future(cache.get(slow))
    await asyncio.sleep(0)
    leaving.cancel()
    release.set()
    assert await staying == "view"
    with pytest.raises(asyncio.CancelledError):
        await leaving
