"""`autoclusters demo --json`, as `make demo` runs it, on its own sandbox: the job restarts
once on other nodes, the node comes back IDLE, and the job recovers well before the node."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import free_port_base


def test_demo_json_summary(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "clients.cli", "demo", "--json", "--boot-delay", "8",
         "--state-dir", str(tmp_path / "demo"), "--port-base", str(free_port_base())],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["status"] == "resolved"
    assert summary["job_restarts"] == 1
    assert summary["node_state_after"] == "IDLE"
    assert summary["node"] not in summary["job_nodes_after"]
    assert summary["capacity_recovery_s"] >= 8
    assert summary["job_recovery_s"] < summary["capacity_recovery_s"] / 2
    names = [s["name"] for s in summary["steps"]]
    assert names.index("requeue") < names.index("repair") < names.index("return_to_service")
    assert all(s["finished_at"] >= s["started_at"] for s in summary["steps"])
