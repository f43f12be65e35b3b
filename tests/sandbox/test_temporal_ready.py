"""When the sandbox calls Temporal ready (sandbox/runtime/daemons.py `temporal_ready`): its ports
answering is not enough (the dev server takes them before its frontend is healthy); the
frontend must answer its health check. A listener that is not Temporal is not ready; a real
dev server is."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.conftest import free_port_base
from tests.helpers import start_temporal


class Squatter:
    """Takes a port, accepts each connection and closes it at once: an open port that
    answers nothing (what a starting server looks like to a port probe)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed: stop
                return
            conn.close()

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def cfg(tmp_path: Path) -> SandboxConfig:
    return SandboxConfig(state_dir=tmp_path / "s", port_base=free_port_base())


@pytest.fixture
def squatters(cfg: SandboxConfig) -> Iterator[None]:
    held = [Squatter(cfg.temporal_port), Squatter(cfg.temporal_ui_port)]
    try:
        yield
    finally:
        for s in held:
            s.close()


def test_nothing_listening_is_not_ready(cfg: SandboxConfig) -> None:
    assert daemons.temporal_ready(cfg) is False


@pytest.mark.usefixtures("squatters")
def test_open_ports_that_are_not_a_healthy_frontend_are_not_ready(cfg: SandboxConfig) -> None:
    assert daemons.port_open(cfg.temporal_port) and daemons.port_open(cfg.temporal_ui_port)
    assert daemons.temporal_ready(cfg) is False


@pytest.mark.integration  # a Temporal dev server of its own
async def test_a_dev_server_with_a_healthy_frontend_is_ready(cfg: SandboxConfig) -> None:
    env = await start_temporal(port=cfg.temporal_port)
    ui = Squatter(cfg.temporal_ui_port)  # the dev server here runs without its UI
    try:
        # From a thread, as `sandbox up` and restarts call it: it runs its own event loop.
        assert await asyncio.to_thread(daemons.temporal_ready, cfg) is True
    finally:
        ui.close()
        await env.shutdown()
