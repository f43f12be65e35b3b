"""The chaos matrix, on real Slurm-on-Kubernetes sandboxes (Crusoe emulator included; shared
with the outage matrix: tests/matrix_sandbox.py):
the worker is SIGKILLed at every step of an incident (drain, requeue, wait_idle, the repair
before and after its cloud call, wait_registered, health_gate, return_to_service), with
everything it keeps on disk wiped before it starts again, and the Temporal server is
SIGKILLed at the repair. In every case a requeueable job runs on the faulty node and the
machine's GPU is really broken until a reboot (at wait_idle a `--no-requeue` job holds the
node too, until the worker was killed and started again), and afterwards:

- the incident resolves, with one repair (a reboot);
- the Crusoe emulator's own record shows exactly one cloud operation for that repair;
- the job was requeued exactly once by us (our AdminComment marker; Slurm's restart count is
  1 plus any requeue slurmctld's log gives as its own, a slurmd it lost under load);
- no node is left drained in Slurm or cordoned in Kubernetes.

The repair's two cases are checked to have landed where they say (the emulator had / had
not recorded the repair's operation at the crash); each case prints which activities ran
again (the crash caught them running).
"""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path

import httpx
import pytest

from autoclusters.core import hostlist
from autoclusters.core.policy import Rung
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.drivers.chaos import ChaosReport, run_chaos
from autoclusters.sandbox.drivers.outage_matrix import matrix, submit_held_job, waves
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable
from tests.helpers import cancel, eventually, job, running, submit_progress_job
from tests.matrix_sandbox import matrix_group

pytestmark = pytest.mark.integration  # the matrices' real sandboxes

# (what is SIGKILLed, `--at`)
CASES = [
    ("worker", "drain"),
    ("worker", "requeue"),
    ("worker", "wait_idle"),
    ("worker", "repair:before-cloud"),
    ("worker", "repair:after-cloud"),
    ("worker", "wait_registered"),
    ("worker", "health_gate"),
    ("worker", "return_to_service"),
    ("temporal", "repair"),
]
# On the matrices' sandboxes (tests/matrix_sandbox.py, shared with the outage matrix), the
# cases dealt out in turn after the outage matrix's waves.
MATRIX = [
    pytest.param(w, a, id=f"{w}@{a}", marks=matrix_group(i + len(waves(matrix()))))
    for i, (w, a) in enumerate(CASES)
]
# An undisturbed incident takes ~10 s here, a crash may add 15 s: this is a stall.
CASE_TIMEOUT_S = 90


def _k8s_cordoned(cfg: SandboxConfig) -> list[str]:
    state = httpx.get(f"{cfg.k8s_url}/_emulator/state", timeout=10, verify=cfg.k8s_tls())
    nodes = state.json()["nodes"]
    return [n["metadata"]["name"] for n in nodes if n.get("spec", {}).get("unschedulable")]


def _describe(what: str, at: str, report: ChaosReport) -> str:
    return (
        f"SIGKILL {what} at {at}: status={report.status} repairs={report.repairs} "
        f"moment={report.killed_at_moment} cloud={report.cloud_operation_log} "
        f"at kill={report.cloud_operations_at_kill} retried={report.retried} "
        f"actions={report.actions} steps={[(s.name, s.detail) for s in report.steps]}"
    )


# slurmctld's own requeues of a batch job (22.05's messages): a node it gave up on, a launch
# that failed. On a machine loaded far past its cores a slurmd can miss its SlurmdTimeout;
# that requeue is Slurm's, counted apart from ours.
_SLURM_OWN_REQUEUE = re.compile(
    r"due to (node )?failure|Attempting to requeue failed job|attempting to requeue batch"
)


def _slurmctld_lines(cfg: SandboxConfig, job_id: int) -> list[str]:
    log = cfg.log_dir / "slurmctld.log"
    tag = re.compile(rf"JobId={job_id}\b")
    return [line for line in log.read_text(errors="replace").splitlines() if tag.search(line)]


async def _release_after_restart(cfg: SandboxConfig, release: Path) -> None:
    """End the held job once the worker runs under another PID (killed and started again
    by the chaos run), so that the wait for idle outlives the kill."""
    table = ProcessTable(cfg.state_dir)
    first = table.get("worker")

    async def restarted() -> bool:
        now = table.get("worker")
        return first is not None and now is not None and now.pid != first.pid

    await eventually(restarted, CASE_TIMEOUT_S, "the worker started again")
    release.touch()


@pytest.mark.parametrize(("what", "at"), MATRIX)
async def test_sigkill_at_every_step(matrix_sandbox: SandboxConfig, what: str, at: str) -> None:
    cfg = matrix_sandbox
    slurm = SlurmCli(cfg.slurm_conf)
    job_id = submit_progress_job(cfg)
    held_id: int | None = None
    release = cfg.state_dir / "jobs" / f"chaos-release-{uuid.uuid4().hex[:6]}"
    try:
        started = await eventually(lambda: running(slurm, job_id), 60, "the job running")
        node = hostlist.expand(started.nodes)[0]
        released = None
        if at == "wait_idle":
            # XID_79 marks the node DOWN as soon as its requeued job is completing there
            # (fence: at_once), so the wait for idle can be over before a kill lands. A job
            # the runbook cannot requeue (--no-requeue) keeps the node busy until the
            # worker has been killed and started again.
            held_id = submit_held_job(cfg, node, release)
            await eventually(lambda: running(slurm, held_id), 60, "the held job running")
            released = asyncio.create_task(_release_after_restart(cfg, release))
        report = await run_chaos(
            cfg, "XID_79", node=node, broken_until=Rung.REBOOT, kill=what, at=at,
            wipe_worker_disk_on_restart=what == "worker", timeout_s=CASE_TIMEOUT_S,
        )  # fmt: skip
        if released is not None:
            released.cancel()
        case = _describe(what, at, report)
        print(case)
        assert report.status == "resolved", case
        assert report.actions[0].startswith(f"killed {what} "), case
        assert not any(a.startswith("never reached") for a in report.actions), case
        if at.startswith("repair:"):
            # The kill really landed on that side of the cloud call.
            assert report.killed_at_moment == at, case
        if what == "worker":
            assert any(a.startswith("wiped the worker's disk: ") for a in report.actions), case
            assert report.wiped, case  # the Slack thread store had this incident's record
        assert report.repairs == ["reboot"], case
        # The emulator's own record: one operation for the one repair, never a second.
        assert report.cloud_operations == len(report.repairs), case
        assert report.cloud_operation_log[0].startswith("RESET "), case

        requeued = await job(slurm, job_id)
        assert requeued is not None, case
        # Once by us, never twice; whatever else moved the job is Slurm's own, in its log.
        lines = _slurmctld_lines(cfg, job_id)
        own = [line for line in lines if _SLURM_OWN_REQUEUE.search(line)]
        assert requeued.restart_cnt == 1 + len(own), (
            f"{case}: restart count {requeued.restart_cnt}; slurmctld on the job: {lines}"
        )
        marker = f"autoclusters:requeue:{report.incident_id}:0"
        assert requeued.admin_comment == marker, f"{case}: {requeued.admin_comment!r}"
        drained = [(n.name, n.reason) for n in await slurm.nodes() if n.drained]
        assert drained == [], f"{case}: left drained {drained}"
        assert _k8s_cordoned(cfg) == [], f"{case}: left cordoned"
    finally:
        release.touch()
        cancel(cfg, job_id)
        if held_id is not None:
            cancel(cfg, held_id)

        async def gone() -> bool:
            j = await job(slurm, job_id)
            return j is None or j.job_state in ("CANCELLED", "COMPLETED", "FAILED")

        await eventually(gone, 60, f"job {job_id} cancelled")
