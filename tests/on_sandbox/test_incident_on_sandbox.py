"""An incident end to end on the real sandbox: Slurm, Temporal dev server, worker process.

- a job on the faulty node is requeued exactly once and runs again on other nodes;
- the node is replaced (new VM id), registers again and comes back IDLE;
- the requeue activity run twice against real Slurm requeues once;
- the CLI refuses an unknown node and starts nothing; list/show read the incident;
- observe mode changes nothing in Slurm (`sinfo --json` before and after);
- approve mode waits for `autoclusters approve`: a non-approver is refused and recorded,
  an approver lets it go on;
- a machine whose fault survives a reboot fails the health gate and is replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.clients import incidents
from autoclusters.core import hostlist
from autoclusters.core.models import ApprovalRequest, IncidentState, RequeueInput, workflow_id
from autoclusters.core.policy import Policy
from autoclusters.core.settings import Settings
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.machines.vms import VmRegistry
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation
from tests.helpers import (
    cancel,
    eventually,
    fresh_policy,
    job,
    running,
    sbatch,
    submit_progress_job,
)

pytestmark = pytest.mark.integration  # the session's real sandbox

CLI = [sys.executable, "-m", "autoclusters.clients.cli"]


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

        # A row-remap failure goes straight to replace: the node gets a new machine.
        opened = await incidents.open_incident(
            sandbox_client, sandbox_settings, faulty, "ROW_REMAP_FAILURE", policy=fresh_policy()
        )
        assert not opened.joined
        handle = sandbox_client.get_workflow_handle_for(
            NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
        )
        state: IncidentState = await handle.result()

        assert state.status == "resolved"
        assert [s.name for s in state.steps] == [
            "guard_register", "notify_opened", "admit_quarantine", "drain", "requeue",
            "notify_recovery_chosen",  # the shipped policy's announce_recovery
            "silence", "wait_idle", "admit_repair", "repair", "wait_registered",
            "health_gate", "return_to_service",
            "measure_recovery",  # the shipped policy's measure_recovery
            "lift_silence", "notify_resolved",
        ]  # fmt: skip
        # The sandbox's real Alertmanager held the node's other alerts silent meanwhile.
        assert state.silence_id is not None
        lifted = state.step("lift_silence")
        assert lifted is not None and lifted.detail == f"silence {state.silence_id} lifted"
        assert state.rung == "replace"
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


@contextlib.contextmanager
def policy_file(cfg: SandboxConfig, policy: Policy) -> Iterator[None]:
    """The sandbox API's policy file says `policy` (what an incident the API opens from an
    agent's report gets) until the block ends."""
    before = cfg.policy_file.read_text()
    cfg.policy_file.write_text(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False))
    try:
        yield
    finally:
        cfg.policy_file.write_text(before)


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


async def test_a_job_fenced_off_its_node_is_held_over_the_down_and_runs_again(
    sandbox: SandboxConfig, slurm: SlurmCli
) -> None:
    """XID_79's `fence: at_once` marks the node DOWN while its requeued job still completes
    there (its batch shell outlives SIGTERM for KillWait). DOWN ends that completing with no
    begin-time delay: Slurm started such a job again within the second of its kill, on a
    node that had just revoked its credential, and the job FAILED (ci12 of 2026-12-06). The
    requeue holds it over the DOWN and lets it go a second later: it runs again."""
    incident = "inc-test-fence-hold"
    shell = "trap '' TERM; while :; do sleep 0.2; done"
    job_id = sbatch(sandbox, "--requeue", "-N2", "--output=/dev/null", f"--wrap={shell}")
    started = await eventually(lambda: running(slurm, job_id), 60, "job running")
    node = started.batch_host  # where its shell outlives the kill
    inp = RequeueInput(
        node=node, incident_id=incident, drain_reason=f"autoclusters: {incident} XID_79",
        fence_after_s=0,
    )  # fmt: skip
    try:
        await slurm.drain(node, inp.drain_reason)
        done = await ActivityEnvironment().run(SlurmActivities(slurm).requeue_jobs, inp)
        assert done.requeued == [job_id] and done.marked_down and done.fence_held == []
        back = await eventually(
            lambda: _running_elsewhere(slurm, job_id, node), 60, "job running again"
        )
        assert back.restart_cnt == 1
        log = (sandbox.state_dir / "log" / "slurmctld.log").read_text()
        held = log.index(f"hold on JobId={job_id} ")
        assert held < log.index(f"node {node} state set to DOWN", held)
        assert f"non-startable batch JobId={job_id}:" not in log
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


def _sinfo_json(cfg: SandboxConfig) -> list[dict[str, object]]:
    out = subprocess.run(
        ["sinfo", "--json"], env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    keep = ("name", "state", "state_flags", "reason", "slurmd_start_time", "boot_time")
    return [{k: n.get(k) for k in keep} for n in json.loads(out)["nodes"]]


async def test_observe_mode_changes_nothing_in_slurm(
    sandbox: SandboxConfig, sandbox_settings: Settings, sandbox_client: Client, slurm: SlurmCli
) -> None:
    job_id = submit_progress_job(sandbox)
    try:
        started = await eventually(lambda: running(slurm, job_id), 60, "job running")
        node = hostlist.expand(started.nodes)[0]
        before = _sinfo_json(sandbox)
        opened = await incidents.open_incident(
            sandbox_client, sandbox_settings, node, "XID_79", policy=fresh_policy(mode="observe")
        )
        handle = sandbox_client.get_workflow_handle_for(
            NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
        )
        state = await handle.result()
        assert state.status == "observed"
        assert any(step.startswith(f"drain {node}") for step in state.planned_steps)
        assert _sinfo_json(sandbox) == before
        after = await job(slurm, job_id)
        assert after is not None and after.job_state == "RUNNING" and after.restart_cnt == 0
        assert after.admin_comment == ""
    finally:
        cancel(sandbox, job_id)


async def test_approve_mode_waits_for_an_approver(
    sandbox: SandboxConfig,
    sandbox_settings: Settings,
    sandbox_client: Client,
    slurm: SlurmCli,
    cli_env: dict[str, str],
) -> None:
    opened = await incidents.open_incident(
        sandbox_client, sandbox_settings, "gpu-03", "XID_48", policy=fresh_policy(mode="approve")
    )
    handle = sandbox_client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )

    async def waiting() -> IncidentState | None:
        st = await handle.query(NodeRemediation.status)
        return st if st.waiting_for and st.waiting_for.kind == "approval" else None

    held = await eventually(waiting, 60, "the approval gate")
    assert held.waiting_for is not None and held.waiting_for.step == "reboot"
    node = await slurm.node("gpu-03")
    assert node is not None and node.drained  # quarantined while it waits

    approve = [*CLI, "approve", opened.incident_id]

    def as_person(token: str) -> dict[str, str]:
        return {**cli_env, "AUTOCLUSTERS_API_TOKEN": token}

    # Reaching Temporal is not enough: a decision without the API's proof is refused.
    with pytest.raises(WorkflowUpdateFailedError) as no_proof:
        await handle.execute_update(
            NodeRemediation.approve, ApprovalRequest(step="reboot", approver="alice")
        )
    assert "no proof of who decides" in str(no_proof.value.cause)
    # Nor is a token the API does not know.
    refused = subprocess.run(
        approve, env=as_person("mallorys-guess-0123456789"), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2 and "invalid bearer token" in refused.stderr
    after_refusal = await handle.query(NodeRemediation.status)
    assert after_refusal.waiting_for is not None  # still waiting
    assert after_refusal.approvals == []

    alice = api_tokens.operator_file(sandbox, "alice").read_text().strip()
    ok = subprocess.run(
        [*approve, "--comment", "go"], env=as_person(alice), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "approved by alice" in ok.stdout
    state = await handle.result()
    assert state.status == "resolved"
    assert [(a.approver, a.step, a.approved) for a in state.approvals] == [
        ("alice", "reboot", True)
    ]
    bob = api_tokens.operator_file(sandbox, "bob").read_text().strip()
    again = subprocess.run(approve, env=as_person(bob), capture_output=True, text=True, timeout=60)
    assert again.returncode == 3  # nothing is waiting any more


async def test_fault_surviving_a_reboot_escalates_to_replace(
    sandbox: SandboxConfig,
    sandbox_settings: Settings,
    sandbox_client: Client,
    slurm: SlurmCli,
    cli_env: dict[str, str],
) -> None:
    # The node's agent reports the injected Xid at once and the API opens the incident
    # under the sandbox's policy file, where an earlier test's incident on gpu-02 would
    # count as a recurrence (straight to replace): forget it there too while this runs.
    with policy_file(sandbox, fresh_policy()):
        broke = subprocess.run(
            [*CLI, "sandbox", "hardware-fault", "--node", "gpu-02", "--fault", "XID_79",
             "--fixed-by", "replace", "--state-dir", str(sandbox.state_dir)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert broke.returncode == 0, broke.stderr
        vm_before = VmRegistry(sandbox.state_dir).get("gpu-02")
        assert vm_before is not None
        # Joins the agent's incident if that came first: one incident either way.
        opened = await incidents.open_incident(
            sandbox_client, sandbox_settings, "gpu-02", "XID_79", policy=fresh_policy()
        )
        handle = sandbox_client.get_workflow_handle_for(
            NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
        )
        state = await handle.result()

    assert state.status == "resolved"
    assert [h.passed for h in state.health] == [False, True]
    # Slurm's side passed after the reboot: it is the node's agent that said the GPU is
    # still broken (its fake backend sees the Xid again), and the replacement's that it is not.
    failed, passed = ({c.name: c for c in h.checks} for h in state.health)
    assert failed["slurmd"].passed and failed["gpu_count"].passed
    assert not failed["gpu_faults"].passed
    assert "XID_79 still reported by the agent" in failed["gpu_faults"].detail
    assert passed["agent_report"].passed and "fake agent" in passed["agent_report"].detail
    assert passed["infiniband"].passed and passed["agent_gpu_count"].passed
    repairs = [s.detail.split(":")[0] for s in state.steps if s.name == "repair"]
    assert repairs == ["reboot", "replace"]
    assert state.rung == "replace"
    vm_after = VmRegistry(sandbox.state_dir).get("gpu-02")
    assert vm_after is not None and vm_after.vm_id != vm_before.vm_id
    node = await slurm.node("gpu-02")
    assert node is not None and node.display_state == "IDLE"

    async def listed() -> list[dict[str, str]] | None:
        out = subprocess.run(
            [*CLI, "incident", "list", "--json", "--state", "resolved", "--node", "gpu-02",
             "--fault", "XID_79"],
            env=cli_env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        rows = [r for r in json.loads(out.stdout) if r["incident_id"] == opened.incident_id]
        return rows or None

    rows = await eventually(listed, 30, "the incident in visibility")
    assert rows[0]["action"] == "replace" and rows[0]["state"] == "resolved"
