"""`autoclusters demo --platform cmk --json` (issue 21, item 4): the demo's incident on Slurm as
Slinky on a CMK cluster resolves with the default platform's guarantees: drain first, the
Node cordoned and emptied, the VM replaced through the Crusoe API, the new Node's slurmd pod
registered, the health gate on the agent's evidence, uncordon, the node back in Slurm.

There the pool names the VM and its Node (sandbox-gpu-2) and the Slurm node is the Node's
hostname-override (gpu-02): the runbook finds the Node and the VM through
activities/machine_of.py, and a replacement's new Node, which joins without the
hostname-override, is given the slot's Slurm name by the wait for it, so its slurmd pod
registers as gpu-02.

In the `scenarios` lane (`make scenarios`; CI runs it after `make test`), not in `make test`:
a whole second demo (~120 s, ~60 s of CPU) that `make test`'s ten minutes on two cores cannot
carry beside the default platform's. The CMK platform itself stays in `make test` on its own
sandbox (tests/on_sandbox/test_cmk_on_sandbox.py: the operator's pods, the agents' DaemonSet, cordon
to drain, scale out and in, delete and create), and the runbook's CMK lookups on fakes
(tests/activities/test_machine_of.py); this adds the demo's incident end to end on that platform.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoclusters.sandbox.runtime.processes import ProcessTable
from tests.conftest import free_port_base
from tests.helpers import run_demo

# The whole demo on its own sandbox, CPU heavy (the module docstring).
pytestmark = [pytest.mark.integration, pytest.mark.scenario]


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
    # elsewhere first: in the job (its standby) or requeued, as on the default platform.
    assert summary["node_state_after"] == "IDLE"
    assert summary["node"] not in summary["job_nodes_after"]
    if summary["job"] == "in-job":  # the training extra is installed (make test does)
        assert summary["job_restarts"] == 0 and summary["recovery_path"] == "in-job"
    else:  # the stand-in has no in-job mode: requeued
        assert summary["job_restarts"] == 1 and summary["recovery_path"] == "requeue"
    assert summary["job_recovery_s"] < summary["capacity_recovery_s"]
    assert summary["provision_s"] is not None and summary["provision_s"] > 0
