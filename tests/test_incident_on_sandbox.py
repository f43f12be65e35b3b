"""An incident end to end on the real sandbox: Slurm, Temporal dev server, worker process.

- a job on the faulty node is requeued exactly once and runs again on other nodes;
- the node is replaced (new VM id), registers again and comes back IDLE;
- the requeue activity run twice against real Slurm requeues once;
- the CLI refuses an unknown node and starts nothing; list/show read the incident.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from activities.slurm import SlurmActivities
from autoclusters import hostlist
from autoclusters.models import IncidentState, RequeueInput, workflow_id
from autoclusters.settings import Settings
from autoclusters.slurm import SlurmCli
from clients import incidents
from sandbox.config import SandboxConfig
from sandbox.vms import VmRegistry
from tests.helpers import cancel, eventually, job, running, submit_progress_job
from workflows.remediation import NodeRemediation

CLI = [sys.executable, "-m", "clients.cli"]


async def test_job_on_faulty_node_requeued_once_and_node_returns_idle(
    sandbox: SandboxConfig, sandbox_settings: Settings, sandbox_client: Client, slurm: SlurmCli
) -> None:
    job_id = submit_progress_job(sandbox)
    try:
        started = await eventually(lambda: running(slurm, job_id), 60, "job running")
        nodes_before = hostlist.expand(started.nodes)
        faulty = nodes_before[0]
        vm_before = VmRegistry(sandbox.state_dir).get(faulty)
        assert vm_before is not None

        opened = await incidents.open_incident(sandbox_client, sandbox_settings, faulty, "XID_79")
        assert not opened.joined
        handle = sandbox_client.get_workflow_handle_for(
            NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
        )
        state: IncidentState = await handle.result()

        assert state.status == "resolved"
        assert [s.name for s in state.steps] == [
            "notify_opened", "drain", "requeue", "repair", "wait_registered",
            "return_to_service", "notify_resolved",
        ]  # fmt: skip
        assert state.requeued_jobs == [job_id]

        again = await eventually(
            lambda: _running_elsewhere(slurm, job_id, faulty), 60, "job running on other nodes"
        )
        assert again.restart_cnt == 1

        node = await slurm.node(faulty)
        assert node is not None
        assert node.display_state == "IDLE", node
        vm_after = VmRegistry(sandbox.state_dir).get(faulty)
        assert vm_after is not None and vm_after.vm_id != vm_before.vm_id
        assert state.new_vm_id == vm_after.vm_id
    finally:
        cancel(sandbox, job_id)


async def _running_elsewhere(slurm: SlurmCli, job_id: int, node: str):  # type: ignore[no-untyped-def]
    j = await running(slurm, job_id)
    return j if j and node not in hostlist.expand(j.nodes) and j.restart_cnt >= 1 else None


async def test_requeue_activity_run_twice_requeues_once(
    sandbox: SandboxConfig, slurm: SlurmCli
) -> None:
    job_id = submit_progress_job(sandbox)
    started = await eventually(lambda: running(slurm, job_id), 60, "job running")
    node = hostlist.expand(started.nodes)[0]
    acts = SlurmActivities(slurm)
    env = ActivityEnvironment()
    inp = RequeueInput(node=node, incident_id="inc-test-requeue-twice")
    try:
        await slurm.drain(node, "autoclusters: inc-test-requeue-twice MANUAL")
        first = await env.run(acts.requeue_jobs, inp)
        second = await env.run(acts.requeue_jobs, inp)
        assert first.requeued == [job_id] and second.requeued == [job_id]
        back = await eventually(lambda: running(slurm, job_id), 60, "job running again")
        assert back.restart_cnt == 1
        # Once more after it restarted elsewhere: still not requeued again.
        await env.run(acts.requeue_jobs, inp)
        after = await job(slurm, job_id)
        assert after is not None and after.restart_cnt == 1 and after.job_state == "RUNNING"
    finally:
        cancel(sandbox, job_id)
        await slurm.resume(node)


async def test_cli_refuses_unknown_node_and_starts_nothing(
    sandbox: SandboxConfig, sandbox_client: Client, cli_env: dict[str, str]
) -> None:
    r = subprocess.run(
        [*CLI, "incident", "open", "--node", "gpu-77", "--fault", "XID_79"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "gpu-77" in r.stderr and "not in Slurm" in r.stderr
    with pytest.raises(RPCError):
        await sandbox_client.get_workflow_handle(workflow_id(sandbox.cluster, "gpu-77")).describe()


def test_cli_refuses_malformed_fault(cli_env: dict[str, str]) -> None:
    r = subprocess.run(
        [*CLI, "incident", "open", "--node", "gpu-01", "--fault", "xid 79; rm -rf"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2
    assert "fault" in r.stderr


async def test_cli_opens_waits_lists_and_shows(
    sandbox: SandboxConfig, cli_env: dict[str, str]
) -> None:
    r = subprocess.run(
        [*CLI, "incident", "open", "--node", "gpu-04", "--fault", "GPU_FELL_OFF_BUS", "--wait"],
        env=cli_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    incident_id = r.stdout.split()[1]
    assert incident_id.startswith("inc-") and incident_id.endswith("-gpu-04")

    shown = subprocess.run(
        [*CLI, "incident", "show", incident_id, "--json"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    state = IncidentState.model_validate_json(shown.stdout)
    assert state.status == "resolved" and state.request.fault == "GPU_FELL_OFF_BUS"
    assert all(s.finished_at and s.finished_at >= s.started_at for s in state.steps)

    async def listed() -> list[dict[str, str]] | None:
        out = subprocess.run(
            [*CLI, "incident", "list", "--json"],
            env=cli_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        rows = [row for row in json.loads(out.stdout) if row["incident_id"] == incident_id]
        return rows or None

    rows = await eventually(listed, 30, "incident in visibility")
    assert rows[0]["node"] == "gpu-04" and rows[0]["status"] == "completed"

    missing = subprocess.run(
        [*CLI, "incident", "show", "inc-20000101-000000-gpu-04"],
        env=cli_env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert missing.returncode == 1 and "no incident" in missing.stderr
