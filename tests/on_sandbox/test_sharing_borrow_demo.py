"""`autoclusters demo --scenario borrow --json` on its own Kubernetes-mode sandbox: an Xid
on a node of a 2-node training job, no spare free; the sharing workflow lends an inference node
to the job for the repair (the job runs at full width on it); the node is replaced (its
reboot fails the gate) and the incident returns it; the sharing workflow gives the borrowed node
back to inference within about one evaluation (the job requeued from its checkpoint onto
the repaired node); no inference request failed and no node ran a Slurm job and an
inference pod at once.

In the `scenarios` lane (`make scenarios`; CI runs it after `make test`), not in `make test`:
two 30 s machine boots, an inference load and a torchrun job make it ~200 s long and ~70 s of
CPU (~80 s beside the suite), which `make test`'s ten minutes on two cores cannot carry. The
borrow itself is checked in `make test` on fakes and the time-skipping server
(tests/workflows/test_gpu_sharing_borrow.py); this adds the whole scenario under a real load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoclusters.core.sharing import BY_SHARING
from tests.conftest import free_port_base
from tests.helpers import run_demo

# An inference load and a torchrun job on 2 cores, with timed waits (the module docstring).
pytestmark = [pytest.mark.integration, pytest.mark.scenario]


# ~5 min alone: a sandbox, a torchrun job, a reboot and a replacement of 30 s boots each
# (the job starts on the borrowed node well before the repair ends).
@pytest.mark.timeout(660)
def test_borrow_scenario_lends_an_inference_node_for_the_repair(tmp_path: Path) -> None:
    r = run_demo(
        tmp_path / "borrow", free_port_base(), "--scenario", "borrow", "--boot-delay", "30",
        timeout_s=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["incident_status"] == "resolved"
    borrowed = s["borrowed_node"]
    assert borrowed and borrowed != s["fault_node"] and s["borrow_status"] == "returned"
    assert "no spare free" in s["borrow_why"]
    # Lent after the fault, given back after the repair: the give-back starts at the
    # sharing workflow's next look once the runbook began returning the node (one interval,
    # plus its read of Prometheus, Kubernetes and Slurm on a busy machine), never before it
    # (it may start before the return step's recorded end); the move's own steps follow.
    assert 0 < s["lent_at_s"] < s["repaired_at_s"] < s["returned_at_s"]
    assert s["give_back_after_repair_s"] is not None
    assert 0 <= s["give_back_after_repair_s"] <= s["evaluate_every_s"] + 3
    own = [(m["node"], m["to"], m["status"]) for m in s["moves"] if m["by"] == BY_SHARING]
    assert own == [(borrowed, "training", "done"), (borrowed, "inference", "done")]
    # Full width throughout: on the borrowed node during the repair, off it after.
    assert (s["job_width_before"], s["job_width_during"], s["job_width_after"]) == (2, 2, 2)
    assert borrowed in s["job_nodes_during"] and s["fault_node"] not in s["job_nodes_during"]
    assert borrowed not in s["job_nodes_after"]
    # It trained on the borrowed node, and lost nothing when it gave it back (it saved on
    # the give-back's checkpoint signal).
    assert s["steps_on_borrowed_node"] > 0
    assert s["steps_redone_at_give_back"] == 0
    assert s["requests"] > 100 and s["request_errors"] == 0, s["request_codes"]
    assert s["samples"] > 50 and s["overlap_samples"] == 0, s["overlaps"]
