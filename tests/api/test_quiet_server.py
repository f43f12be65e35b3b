"""The quiet uvicorn server (clients/web/quiet_server.py) the API and the emulators run:

- it serves, with a Date header that keeps up with the clock;
- idle, it ticks about once a second, not uvicorn's ten times;
- `should_exit` set from another thread stops it at once, not at its next tick;
- `exiting()` returns once a stop is asked for.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from email.utils import parsedate_to_datetime

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from autoclusters.clients.web import quiet_server
from autoclusters.clients.web.quiet_server import QuietServer
from autoclusters.sandbox.runtime.processes import wait_until

WAIT_S = 10.0


class Served:
    def __init__(self, server: QuietServer, url: str, thread: threading.Thread) -> None:
        self.server, self.url, self.thread = server, url, thread
        self.ticks = 0


@pytest.fixture
def served() -> Iterator[Served]:
    app = FastAPI()

    @app.get("/")
    def root() -> dict[str, str]:
        return {"ok": "yes"}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = QuietServer(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    s = Served(server, f"http://127.0.0.1:{sock.getsockname()[1]}/", thread)
    on_tick = server.on_tick

    async def counted(counter: int) -> bool:
        s.ticks += 1
        return await on_tick(counter)

    server.on_tick = counted  # type: ignore[method-assign]
    thread.start()
    wait_until(lambda: server.started or not thread.is_alive(), WAIT_S, 0.01)
    assert server.started, "the server did not start"
    try:
        yield s
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


def test_it_serves_with_a_date_header_that_keeps_up(served: Served) -> None:
    first = httpx.get(served.url)
    assert first.json() == {"ok": "yes"}
    start = parsedate_to_datetime(first.headers["date"])

    def later() -> bool:
        return parsedate_to_datetime(httpx.get(served.url).headers["date"]) > start

    assert wait_until(later, WAIT_S), "the Date header stopped at " + str(start)


def test_idle_it_ticks_about_once_a_second(served: Served) -> None:
    before, began = served.ticks, time.monotonic()
    time.sleep(1.5)
    seconds = time.monotonic() - began
    # uvicorn's own loop: 15 ticks in 1.5 s; ours at most one a second, and one more
    # for where the window starts.
    assert served.ticks - before <= seconds / quiet_server.TICK_S + 1


def test_a_stop_from_another_thread_is_at_once(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    tick = quiet_server.TICK_S
    monkeypatch.setattr(quiet_server, "TICK_S", 60.0)
    time.sleep(tick * 1.5)  # the wait in progress ends: the next one is a 60 s one
    stopping = time.monotonic()
    served.server.should_exit = True
    served.thread.join(WAIT_S)
    assert not served.thread.is_alive()
    assert time.monotonic() - stopping < 5.0  # not the 60 s tick


def test_exiting_returns_once_a_stop_is_asked(served: Served) -> None:
    loop = served.server._loop
    assert loop is not None
    waited = asyncio.run_coroutine_threadsafe(served.server.exiting(), loop)
    with pytest.raises(TimeoutError):
        waited.result(timeout=0.2)
    served.server.should_exit = True
    waited.result(timeout=WAIT_S)
