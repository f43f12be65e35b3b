"""A Temporal dev server, and what serves on it, on a thread of its own: for tests of the
CLI, which runs its own `asyncio.run` (that cannot nest in a running loop)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

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


@dataclass
class ServedQueue:
    """A task queue with a worker on the dev server's thread, for the CLI's tests."""

    address: str
    queue: str
    client: Client
    loop: asyncio.AbstractEventLoop

    def call(self, coro: Any) -> Any:
        return call_on(self.loop, coro)


def call_on(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    """Run `coro` on the server thread's loop (where its client lives). 90 s only stops a
    test hanging on a server that never answers: the calls answer in well under a second."""
    return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=90)


def cli_cluster(served: ServedQueue, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh cluster name, the CLI's settings (its environment) pointed at it and at the
    served queue; its name."""
    name = f"c{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__ADDRESS", served.address)
    monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__TASK_QUEUE", served.queue)
    monkeypatch.setenv("AUTOCLUSTERS_CLUSTER", name)
    return name


@contextmanager
def served_workflows(prefix: str, workflows: Sequence[type]) -> Iterator[ServedQueue]:
    """A dev server on a thread, and a worker there running `workflows` (no activities) on
    a task queue of its own named from `prefix`."""

    @asynccontextmanager
    async def serve(client: Client) -> AsyncIterator[ServedQueue]:
        queue = f"{prefix}-{uuid.uuid4().hex[:6]}"
        async with Worker(client, task_queue=queue, workflows=list(workflows)):
            yield ServedQueue(
                address=client.service_client.config.target_host,
                queue=queue,
                client=client,
                loop=asyncio.get_running_loop(),
            )

    with dev_server_thread(serve) as served:
        yield served
