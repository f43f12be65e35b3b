"""The boot's watch over the machines' daemons while the cluster is provisioned: an agent
that exits at its start (its /metrics port taken: ci15 of 2026-12-06) left the health gate
waiting out 300 s for its first report; the boot now stops at once, naming the daemon and
its log's last lines, and a daemon that keeps running or is stopped on purpose is no
failure."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoclusters.sandbox import provision
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable, referencing, stop_referencing

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]
IN_USE = [sys.executable, "-c", "raise SystemExit('OSError: [Errno 98] Address already in use')"]


@pytest.fixture
def cfg(tmp_path: Path) -> Iterator[SandboxConfig]:
    """A state dir whose processes are all stopped by their PIDs when the test ends."""
    cfg = SandboxConfig(state_dir=tmp_path / "state", cluster="watch", nodes=2, port_base=20000)
    yield cfg
    stop_referencing(cfg.state_dir)
    assert referencing(cfg.state_dir) == []


async def _watch_for(cfg: SandboxConfig, seconds: float) -> None:
    await asyncio.wait_for(provision._a_machine_daemon_exits(cfg), seconds)


def test_an_agent_that_exits_stops_the_boot_with_its_log(cfg: SandboxConfig) -> None:
    table = ProcessTable(cfg.state_dir)
    table.spawn("slurmd-gpu-01", SLEEPER)
    table.spawn("agent-gpu-01", IN_USE)
    started = time.monotonic()
    with pytest.raises(SandboxError) as raised:
        asyncio.run(_watch_for(cfg, 30))
    assert time.monotonic() - started >= provision._DEAD_FOR_S  # a restart's grace
    said = str(raised.value)
    assert "agent-gpu-01 exited while the cluster was provisioned" in said
    assert "Address already in use" in said  # its log's last lines


def test_daemons_that_run_are_stopped_or_start_again_are_no_failure(cfg: SandboxConfig) -> None:
    table = ProcessTable(cfg.state_dir)
    table.spawn("agent-gpu-01", SLEEPER)
    table.spawn("slurmd-gpu-01", SLEEPER)
    table.stop("slurmd-gpu-01")  # a machine powered off on purpose: its record goes

    async def kubelet_restarts_it() -> None:
        # A pod's container that died, started again by the (CMK) kubelet a pass later.
        table.spawn("agent-gpu-02", IN_USE)
        watch = asyncio.ensure_future(_watch_for(cfg, provision._DEAD_FOR_S + 3))
        await asyncio.sleep(2)  # the kubelet's pass: the restart comes this much later
        assert not table.alive("agent-gpu-02")
        table.spawn("agent-gpu-02", SLEEPER)
        await watch

    with pytest.raises(TimeoutError):
        asyncio.run(kubelet_restarts_it())
