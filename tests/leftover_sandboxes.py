"""Sandboxes a test run left running, stopped at the end of the run by their recorded PIDs.

A fixture's teardown stops its sandbox; an interrupted run (Ctrl-C, a fixture that timed
out) skips teardowns, and a sandbox left up holds ports, CPU and its Slurm daemons until
someone finds it. `pytest_sessionfinish` (conftest) calls this over the run's temporary
directory: whatever sandbox there still has a live recorded process goes down.
"""

from __future__ import annotations

import os
from pathlib import Path

from autoclusters.core.process_start import parent_pid
from autoclusters.sandbox import cluster
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable


def _self_and_ancestors() -> set[int]:
    pids: set[int] = set()
    pid: int | None = os.getpid()
    while pid is not None and pid > 1:
        pids.add(pid)
        pid = parent_pid(pid)
    return pids


def stop_left_running(base: Path) -> list[Path]:
    """Stop every sandbox under `base` with a recorded process still alive; their dirs.
    A "sandbox" whose record names this process or one above it is a test's fake (the
    hermetic-settings tests record pytest itself as a running Temporal): never signalled."""
    stopped = []
    ours = _self_and_ancestors()
    for pids in sorted(base.glob("**/pids")):
        state = pids.parent
        table = ProcessTable(state)
        alive = [r for r in table.records() if table.alive(r.name)]
        if not alive or any(r.pid in ours for r in alive):
            continue
        # A boot interrupted before it saved its record: the state dir is enough to stop it.
        record = SandboxConfig(state_dir=state).record_file
        cfg = SandboxConfig.load(state) if record.exists() else SandboxConfig(state_dir=state)
        cluster.down(cfg)
        stopped.append(state)
    return stopped
