"""`autoclusters demo --scenario hang|slow --json` on its own sandbox (issue 40): the in-job
example job trains, one training rank hangs (or runs 2x slower) with no Xid and nothing in
the node's hardware readings (`sandbox job-fault`); the node's agent finds it in the job's
progress and opens JOB_HANG (or SLOW_NODE) on that node and no other; the incident
resolves and the job steps again at full speed without that rank.

In the `scenarios` lane (`make scenarios`; CI runs it after `make test`), not in `make test`:
each is a whole demo of its own (a sandbox, torch on three nodes, ~25 s of waiting for the
hang threshold or the straggler's window, ~100 s in all) beside the default demo's. What
they rest on is in `make test` too: the rules on made-up progress
(tests/agent/test_job_progress.py), the silent faults' choices, watcher and summary readings
(tests/sandbox/test_silent_faults.py), and the effects themselves on a sandbox
(tests/on_sandbox/test_fault_effects_on_sandbox.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import free_port_base
from tests.helpers import run_demo

# Three ranks of torch and their waits are timed (the module docstring).
pytestmark = [pytest.mark.integration, pytest.mark.scenario]

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is not installed (the training extra)", allow_module_level=True)


def _demo(tmp_path: Path, scenario: str) -> dict[str, object]:
    r = run_demo(
        tmp_path / scenario, free_port_base(), "--scenario", scenario, "--no-k8s",
        "--boot-delay", "2", timeout_s=420,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    summary: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return summary


@pytest.mark.timeout(480)
def test_a_silent_hang_opens_job_hang_on_its_node_and_the_job_goes_on(tmp_path: Path) -> None:
    s = _demo(tmp_path, "hang")
    assert s["status"] == "resolved"
    assert s["fault"] == "JOB_HANG" and s["detected_by"] == "job-progress"
    assert s["named_node"] == s["node"] and s["other_nodes_named"] == [] and s["right_node"]
    assert s["rule"] == "heartbeat"  # SIGSTOP: its heartbeat stopped, the others' went on
    detect, again = s["detect_s"], s["job_recovery_s"]
    assert isinstance(detect, float) and isinstance(again, float)
    # No sooner than the hang threshold's floor (25 s): the job made no step before that.
    assert 24 < detect < 60
    assert detect < again < detect + 60
    assert s["recovery_path"] == "in-job"
    assert s["node"] not in s["job_nodes_after"]  # type: ignore[operator]


@pytest.mark.timeout(480)
def test_a_2x_straggler_opens_slow_node_on_its_node_and_speed_comes_back(tmp_path: Path) -> None:
    s = _demo(tmp_path, "slow")
    assert s["status"] == "resolved"
    assert s["fault"] == "SLOW_NODE" and s["detected_by"] == "job-progress"
    assert s["named_node"] == s["node"] and s["other_nodes_named"] == [] and s["right_node"]
    assert s["rule"] == "slow_steps" and s["slow_factor"] == 2.0
    before, faulted, after = s["step_s_before"], s["step_s_faulted"], s["step_s_after"]
    assert isinstance(before, float) and isinstance(faulted, float) and isinstance(after, float)
    assert faulted > 1.5 * before  # the whole job stepped at the straggler's pace
    assert after < 1.25 * before  # and at full speed without it
    detect, again = s["detect_s"], s["job_recovery_s"]
    assert isinstance(detect, float) and isinstance(again, float)
    assert detect < 60 and detect < again
    if s["node"] in s["job_nodes_after"]:  # type: ignore[operator]
        # Only a node that passed its screen and went back to service unrepaired (the
        # sandbox's slowdown is its processes', gone with them) may run the job again.
        screen = s["screen"]
        assert isinstance(screen, dict) and screen["passed"], screen
