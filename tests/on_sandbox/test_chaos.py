"""Durable execution under chaos, on real sandboxes:

- the worker is SIGKILLed in the middle of the repair: a new worker resumes the incident,
  the keyed repair is resumed (one machine operation, not two), and the job's Slurm
  restart count is exactly 1;
- the Temporal server is restarted in the middle of the incident: it still resolves (on
  a matrices' sandbox, Slurm on Kubernetes).
"""

from __future__ import annotations

import re

import pytest

from autoclusters.core import hostlist
from autoclusters.core.policy import load_policy
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.drivers.chaos import ChaosReport, run_chaos
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests.helpers import cancel, eventually, job, running, submit_progress_job
from tests.matrix_sandbox import matrix_group

pytestmark = pytest.mark.integration  # real sandboxes (Temporal dev server, Slurm)


def planned_rung(sandbox: SandboxConfig, report: ChaosReport) -> str:
    """The rung the sandbox's policy gives the fault, counting the earlier incidents on the
    node that the fleet guard reported when the incident opened."""
    reg = next(s for s in report.steps if s.name == "guard_register")
    recent = re.match(r"(\d+) recent on node", reg.detail)
    assert recent, reg.detail
    policy = load_policy(sandbox.policy_file)
    return policy.rung_for(report.fault, int(recent.group(1))).value


async def test_worker_killed_mid_repair_incident_still_resolves_once(
    sandbox: SandboxConfig, slurm: SlurmCli
) -> None:
    job_id = submit_progress_job(sandbox)
    try:
        started = await eventually(lambda: running(slurm, job_id), 60, "job running")
        node = hostlist.expand(started.nodes)[0]
        report = await run_chaos(sandbox, "XID_48", node=node, kill_worker_at="repair")

        assert report.status == "resolved", report
        assert (
            report.actions[0].startswith("killed worker") and "during repair" in report.actions[0]
        )
        assert report.actions[1].startswith("started worker")
        # One repair, of the rung the policy plans for this node: the shared sandbox's
        # earlier tests may have had incidents on it (one rung up per earlier incident).
        rung = planned_rung(sandbox, report)
        assert report.repairs == [rung]
        # The retried repair resumed, not repeated: one RESET for a reboot; a replace here
        # deletes the VM and creates its successor, one of each (the crash may land between
        # them, its progress lost: the create comes from the spec recorded with the plan).
        expected = ["DELETE", "CREATE"] if rung == "replace" else ["RESET"]
        actions = [line.split()[0] for line in report.cloud_operation_log]
        assert actions == expected, report.cloud_operation_log

        async def restarted_once():  # type: ignore[no-untyped-def]
            j = await job(slurm, job_id)
            return j if j and j.job_state == "RUNNING" and j.restart_cnt >= 1 else None

        after = await eventually(restarted_once, 60, "the job running again")
        assert after.restart_cnt == 1
        n = await slurm.node(node)
        assert n is not None and n.display_state == "IDLE"
    finally:
        cancel(sandbox, job_id)


# On a matrices' sandbox (tests/matrix_sandbox.py: Slurm on Kubernetes, the Crusoe
# emulator), after the chaos matrix's cases there: its own sandbox was a boot of its own
# (~25 s of CPU in `make test`) for one incident. The matrix sandbox makes every case a
# first incident on its node, so the repair is still the policy's first rung.
@matrix_group(0)
async def test_temporal_restarted_mid_incident_still_resolves(
    matrix_sandbox: SandboxConfig,
) -> None:
    report = await run_chaos(
        matrix_sandbox, "XID_79", node="gpu-02", restart_temporal_at="repair", timeout_s=300
    )
    assert report.status == "resolved", report
    assert report.actions and report.actions[0].startswith("restarted Temporal during repair")
    assert report.repairs == ["reboot"]
    assert report.machine_operations == 1
