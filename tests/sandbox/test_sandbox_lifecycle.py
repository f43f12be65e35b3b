"""The sandbox's own promises, on real daemons:

- `up` on a running sandbox is a no-op that says so;
- a second sandbox (own state dir and ports) runs beside the first;
- a daemon that cannot start stops the whole start, everything started is stopped again,
  and its log lines are in the error;
- `down` stops exactly the recorded PIDs, and nothing of the sandbox is left running.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from autoclusters.core.process_start import start_ticks
from autoclusters.sandbox import cluster
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable
from tests.conftest import free_port_base

pytestmark = pytest.mark.integration  # real sandboxes

CLI = [sys.executable, "-m", "autoclusters.clients.cli", "sandbox"]


def _no_recorded_process_alive(records: list) -> bool:  # type: ignore[type-arg]
    return all(start_ticks(r.pid) != r.start_ticks for r in records)


def test_up_again_is_a_noop(sandbox: SandboxConfig) -> None:
    table = ProcessTable(sandbox.state_dir)
    pids = {r.name: r.pid for r in table.records()}
    again = cluster.up(sandbox)
    assert again.already_running and not again.started
    assert {r.name: r.pid for r in table.records()} == pids


def _second_up_args(state: Path, base: int) -> list[str]:
    """`sandbox up`'s arguments for the second sandbox: its first start and its restart."""
    return ["up", "--nodes", "2", "--state-dir", str(state), "--port-base", str(base),
            "--cluster", "second", "--boot-delay", "1"]  # fmt: skip


@dataclass(frozen=True)
class Second:
    """A second sandbox started with the CLI beside the shared one, and what `up` said."""

    state: Path
    base: int
    up: subprocess.CompletedProcess[str]

    @property
    def up_args(self) -> list[str]:
        return _second_up_args(self.state, self.base)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "AUTOCLUSTERS_CONFIG": str(self.state / "autoclusters.toml")}


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Second]:
    """One second sandbox for the two tests below (one boot, where each once had its own):
    the first sees it start beside the shared one, the second restarts it."""
    state = tmp_path_factory.mktemp("second")
    base = free_port_base()
    up = subprocess.run(
        [*CLI, *_second_up_args(state, base)],
        capture_output=True, text=True, timeout=300,  # a boot waits for its turn (boot_slots)
    )  # fmt: skip
    try:
        yield Second(state, base, up)
    finally:
        subprocess.run([*CLI, "down", "--state-dir", str(state)], timeout=120)


def test_second_sandbox_beside_the_first_via_cli(sandbox: SandboxConfig, second: Second) -> None:
    assert second.up.returncode == 0, second.up.stderr + second.up.stdout
    assert f"http://127.0.0.1:{second.base + 1}" in second.up.stdout
    state = str(second.state)
    # 180 s guards against a hang only: on a loaded 2-core machine (load 40) the CLI's start
    # and its check that the sandbox's worker polls took over 60 s.
    again = subprocess.run(
        [*CLI, "up", "--nodes", "2", "--state-dir", state, "--port-base", str(second.base)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert again.returncode == 0 and "already running" in again.stdout
    status = subprocess.run(
        [*CLI, "status", "--state-dir", state], capture_output=True, text=True, timeout=180
    )
    assert status.returncode == 0
    assert "gpu-02" in status.stdout and "IDLE" in status.stdout
    # The first sandbox is untouched.
    assert cluster.is_running(sandbox)


def test_incident_history_survives_a_restart(sandbox: SandboxConfig, second: Second) -> None:
    assert second.up.returncode == 0, second.up.stderr + second.up.stdout
    state = second.state
    incident = [sys.executable, "-m", "autoclusters.clients.cli", "incident"]
    opened = subprocess.run(
        [*incident, "open", "--node", "gpu-01", "--fault", "XID_48", "--wait"],
        env=second.env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert opened.returncode == 0, opened.stderr
    incident_id = opened.stdout.split()[1]
    records = ProcessTable(state).records()
    down = subprocess.run(
        [*CLI, "down", "--state-dir", str(state)], capture_output=True, text=True, timeout=120
    )
    # `down` stops exactly the recorded PIDs: all of the second's, none of the first's.
    assert down.returncode == 0, down.stderr
    assert records and _no_recorded_process_alive(records)
    assert cluster.is_running(sandbox)
    # An earlier run's job log: job ids start again at 1 in the new cluster.
    stale = state / "jobs" / "train-1.log"
    stale.write_text("ts=1 node=gpu-01 restart=0 step=1\n")
    assert subprocess.run([*CLI, *second.up_args], timeout=180).returncode == 0
    assert not stale.exists()
    shown = subprocess.run(
        [*incident, "show", incident_id, "--json"],
        env=second.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "resolved"


def test_failed_start_is_cleaned_up_and_shows_the_log(tmp_path: Path) -> None:
    base = free_port_base()
    # Machines that boot in a second: the failure comes after they have (the default 20 s
    # would only wait).
    cfg = SandboxConfig(
        state_dir=tmp_path / "broken", nodes=2, port_base=base, cluster="broken", boot_delay_s=1
    )
    # Something else already holds slurmctld's port: slurmctld cannot start.
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("0.0.0.0", cfg.slurmctld_port))
        squatter.listen()
        with pytest.raises(SandboxError) as err:
            cluster.up(cfg, timeout_s=20)
    msg = str(err.value)
    # The provisioning (its configure step: the emulator starts slurmctld) fails with the
    # daemon's own last words.
    assert "provisioning cluster broken failed" in msg
    assert "slurmctld exited" in msg and "Address already in use" in msg
    table = ProcessTable(cfg.state_dir)
    assert table.records() == []  # munged and temporal were started, then stopped again
    assert _processes_mentioning(str(cfg.state_dir)) == []


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError):
            continue
        if text in cmd and start_ticks(int(proc.name)) is not None:
            found.append(cmd)
    return found


def test_down_without_sandbox_says_so(tmp_path: Path) -> None:
    r = subprocess.run(
        [*CLI, "down", "--state-dir", str(tmp_path / "none")], capture_output=True, text=True
    )
    assert r.returncode == 1 and "no sandbox" in r.stderr
