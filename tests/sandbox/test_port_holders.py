"""When a daemon cannot bind its port, the sandbox's error says who holds it (read from
/proc): the listening process by PID and command line, or a socket no process has."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from autoclusters.sandbox.runtime.port_holders import explain, holders, listens


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_the_listener_is_named_by_its_pid(listening: int) -> None:
    held = holders(listening)
    assert [(h.state, h.pid) for h in held] == [("LISTEN", os.getpid())]
    assert held[0].argv  # this process's command line


def test_a_log_that_could_not_bind_gets_who_holds_the_port(listening: int) -> None:
    tail = (
        "Temporal Server:      localhost:7233\n"
        f"Error: can't set frontend port {listening}: listen tcp 127.0.0.1:{listening}: "
        "bind: address already in use"
    )
    said = explain(tail)
    assert said.startswith(f"port {listening} was in use: LISTEN by PID {os.getpid()} (")
    assert explain("Temporal Server:      localhost:7233\nready") == ""


def test_a_free_port_is_held_by_nothing() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert holders(port) == []
    assert explain(f"listen tcp 127.0.0.1:{port}: bind: address already in use") == (
        f"port {port} was in use: nothing now"
    )


def test_listens_is_true_only_for_the_process_that_listens(listening: int) -> None:
    """The slurmctld readiness probe: a squatter on the port is not the daemon started."""
    assert listens(os.getpid(), listening)
    assert not listens(os.getppid(), listening)  # the port is held, but not by it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not listening
        assert not listens(os.getpid(), s.getsockname()[1])
