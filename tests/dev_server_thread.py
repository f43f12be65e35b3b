"""A Temporal dev server, and what serves on it, on a thread of its own: for tests of the
CLI, which runs its own `asyncio.run` (that cannot nest in a running loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any, TypeVar

from temporalio.client import Client

from tests.helpers import start_temporal

T = TypeVar("T")


@contextmanager
def dev_server_thread(serve: Callable[[Client], AbstractAsyncContextManager[T]]) -> Iterator[T]:
    """Start a dev server on a thread, enter `serve(client)` there (its workers) and yield
    what it yields; on the way out stop both and check the thread ended."""
    ready: dict[str, Any] = {}
    started = threading.Event()
    stop: list[asyncio.Event] = []
    errors: list[BaseException] = []

    async def main() -> None:
        env = await start_temporal()
        stop.append(asyncio.Event())
        try:
            async with serve(env.client) as served:
                ready.update(served=served, loop=asyncio.get_running_loop())
                started.set()
                await stop[0].wait()
        finally:
            await env.shutdown()

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as e:  # shown by the fixture, not lost in the thread
            errors.append(e)
            started.set()

    thread = threading.Thread(target=run, name="temporal-dev-server", daemon=True)
    thread.start()
    assert started.wait(120), "the dev server did not start within 120 s"
    if errors:
        raise errors[0]
    try:
        yield ready["served"]
    finally:
        ready["loop"].call_soon_threadsafe(stop[0].set)
        thread.join(60)
        assert not thread.is_alive(), "the dev server thread did not stop"
