"""`autoclusters demo --scenario share --json` on its own Kubernetes-mode sandbox: the
inference SLO is breached, a training node is lent (its job checkpointed and requeued once,
resuming narrower from its checkpoint), the load falls, the node comes back through the
health gate and the job regrows to full width; a sampler of both sides of every node never
saw a Slurm job and an inference pod on one node at once.

In the `scenarios` lane (`make scenarios`; CI runs it after `make test`), not in `make test`:
its inference load keeps a core busy for two minutes (~70 s of CPU alone, ~110 s beside the
suite), which `make test`'s ten minutes on two cores cannot carry. What it checks of the
runbook's lend and return is checked in `make test` too: on fakes and the time-skipping
server (tests/workflows/test_gpu_sharing.py), in the recorded histories
(tests/workers/test_replay.py), and the inference side's kubelet and gateway on loopback
(tests/emulators/test_inference_sandbox.py); this adds the whole scenario under a real load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoclusters.core.sharing import BY_SHARING
from tests.conftest import free_port_base
from tests.helpers import run_demo

# Its inference load is CPU-bound and its waits are timed (the module docstring).
pytestmark = [pytest.mark.integration, pytest.mark.scenario]


# ~130 s alone; its inference load is CPU-bound, and beside the rest of the suite it took
# over the default 300 s. The demo's own subprocess timeout (600 s) is the bound.
@pytest.mark.timeout(660)
def test_share_scenario_lends_and_returns_a_node(tmp_path: Path) -> None:
    r = run_demo(
        tmp_path / "share", free_port_base(), "--scenario", "share", "--boot-delay", "2",
        timeout_s=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    own = [m for m in s["moves"] if m["by"] == BY_SHARING]
    assert [(m["to"], m["status"]) for m in own] == [("inference", "done"), ("training", "done")]
    lend, back = own
    assert lend["node"] == back["node"]
    assert "SLO" in lend["why"] and lend["steps"][-1] == "mark_lent"
    assert back["steps"][2:5] == ["health_gate", "health_verdict", "resume_in_slurm"]
    assert s["lend_s"] is not None and s["lend_s"] > 0
    assert s["return_s"] is not None
    # Full width, narrower while the node was lent, full width again.
    assert (s["job_width_before"], s["job_width_during"], s["job_width_after"]) == (3, 2, 3)
    # One requeue for the lend, one to regrow: never two for the lend.
    assert s["training_restarts"] == 2
    if s["job"] == "torchrun":
        assert s["resumed_after_lend"] and s["resumed_after_lend"] > 0
        assert s["resumed_from_step"] >= s["resumed_after_lend"]
    # Slurm user work and Kubernetes user work never on one node at once.
    assert s["samples"] > 50 and s["overlap_samples"] == 0, s["overlaps"]
    assert s["requests"] > 100 and s["request_errors"] == 0, s["request_codes"]
    assert s["slo_attainment"] is not None and 0 < s["slo_attainment"] <= 1
