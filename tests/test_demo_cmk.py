"""`autoclusters demo --platform cmk --json` (issue 21, item 4): the demo's incident on Slurm as
Slinky on a CMK cluster resolves with the default platform's guarantees: drain first, the
Node cordoned and emptied, the VM replaced through the Crusoe API, the new Node's slurmd pod
registered, the health gate on the agent's evidence, uncordon, the node back in Slurm.

Expected to fail until the runbook finds a Slurm node's Kubernetes Node and Crusoe VM on
CMK: there the pool names the VM and its Node (sandbox-gpu-2) and the Slurm node is the
Node's hostname-override (gpu-02), while the runbook takes the Slurm node's name for both
(k8s_cordon ends the incident: UnknownNode gpu-02), and a replacement's new Node carries no
hostname-override, so its slurmd pod would register under the VM's name. It is skipped
until then; the fix takes the mark off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoclusters.sandbox.processes import ProcessTable
from tests.conftest import free_port_base
from tests.helpers import run_demo

# The whole demo on its own sandbox, CPU heavy (tests/test_demo.py's reasons).
pytestmark = [pytest.mark.integration, pytest.mark.alone]


# Skipped rather than xfail: a failing demo costs the suite about 3 minutes of CPU for a gap
# that is known (docs/testing.md counts every minute). Take this mark off with the fix.
@pytest.mark.skip(
    reason="the runbook takes the Slurm node's name for the CMK Node's and VM's (issue 21)"
)
@pytest.mark.timeout(420)
def test_demo_on_the_cmk_platform_resolves(tmp_path: Path) -> None:
    state = tmp_path / "demo"
    r = run_demo(state, free_port_base(), "--platform", "cmk", "--boot-delay", "5", timeout_s=360)
    # run_demo took the sandbox down by its PIDs: nothing of it is left running.
    table = ProcessTable(state)
    assert [rec.name for rec in table.records() if table.alive(rec.name)] == []
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["platform"] == "cmk" and summary["kubernetes"] is True
    # The fault reached the incident before anything else was asked of the runbook.
    assert summary["detected_by"] == "agent" and 0 <= summary["detect_s"] < 10
    assert summary["status"] == "resolved", summary["steps"]
    assert summary["rung"] == "replace"
    assert summary["old_vm_id"] and summary["new_vm_id"]
    assert summary["old_vm_id"] != summary["new_vm_id"]
    assert summary["health_gates"][-1] is True
    names = [s["name"] for s in summary["steps"]]
    assert names.index("drain") < names.index("k8s_cordon") < names.index("k8s_evict")
    assert names.index("k8s_evict") < names.index("repair")
    assert names.index("k8s_uncordon") < names.index("return_to_service")
    # The node is back in Slurm (its new Node's slurmd pod registered) and the job recovered
    # elsewhere first.
    assert summary["node_state_after"] == "IDLE"
    assert summary["job_restarts"] == 1 and summary["node"] not in summary["job_nodes_after"]
    assert summary["job_recovery_s"] < summary["capacity_recovery_s"]
    assert summary["provision_s"] is not None and summary["provision_s"] > 0
