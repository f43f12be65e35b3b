"""`autoclusters demo --scenario leaf --json` on its own 8-node sandbox (issue 42 item 1):
IB_LINK_DOWN on the four nodes of one InfiniBand leaf within 10 s is one systemic incident
that owns them; no machine is rebooted or replaced, the floor is never crossed, the leaf
is handed to the provider (the sandbox's ticket desk) once, the other leaf's job is
untouched; after the fabric is reported fixed the four are screened together and back.

In the `scenarios` lane (`make scenarios`; CI runs it after `make test`), not in `make test`:
a whole demo of its own on eight nodes. What it rests on is in `make test` too: the guard's
grouping (tests/workflows/test_systemic_guard.py) and the systemic incident with its members,
the floor, the races, a failed screen and a declined hand-off
(tests/workflows/test_systemic_incident.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import free_port_base
from tests.helpers import run_demo

# Eight nodes, their agents and a screen job across four of them (the module docstring).
pytestmark = [pytest.mark.integration, pytest.mark.scenario]

LEAF = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


@pytest.mark.timeout(600)
def test_a_bad_leaf_is_one_systemic_incident_and_no_machine_is_touched(tmp_path: Path) -> None:
    r = run_demo(
        tmp_path / "leaf", free_port_base(), "--scenario", "leaf", "--no-k8s",
        "--boot-delay", "2", timeout_s=540,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["systemic_status"] == "resolved"
    assert (s["level"], s["domain"]) == ("leaf", "leaf-01")
    assert str(s["systemic_incident"]).endswith("-leaf-01")
    assert sorted(s["members"]) == LEAF
    assert s["faults_spread_s"] < 10
    assert s["machines_replaced"] == 0 and s["machines_rebooted"] == 0
    assert s["handoffs"] == 1 and s["ticket"]
    assert s["min_in_service"] >= s["floor"]
    assert s["other_leaf_job_untouched"]
    members = {m["node"]: m for m in s["member_incidents"]}
    assert sorted(members) == LEAF
    for m in members.values():
        assert m["status"] == "resolved" and m["verdict"] == "returned", m
        assert m["repairs"] == 0 and m["vm_after"] == m["vm_before"] and m["returned"], m
    assert "together" in s["screen"]
