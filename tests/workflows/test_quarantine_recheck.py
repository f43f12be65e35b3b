"""Re-verify the quarantine right before every destructive step (issue 10, item 4), and
heartbeats on every step that can outlive a few seconds (item 5).

Workflow tests run NodeRemediation on the time-skipping test server against the in-memory
Slurm, cloud and health gate of tests/fakes/systems.py (the harness of test_remediation_workflow):

- the node is undrained while the incident waits for approval and jobs land on it: after
  the approval it is drained again, the new requeueable job is requeued exactly once, and
  the reboot happens only once the job that could not be requeued has ended;
- an admin drained it under another reason meanwhile: the incident fails, no repair;
- the node does not go idle after the second quarantine: the incident fails, no repair,
  the job keeps running and the node stays drained under the incident;
- every activity call that can take long carries a heartbeat timeout of at most 10 s.

Unit tests run `verify_quarantine` and the heartbeats of a slow Slurm call in an
ActivityEnvironment.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from autoclusters.activities.job_markers import requeue_marker
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.clients import incidents
from autoclusters.core.models import DrainInput, IncidentState
from autoclusters.core.policy import Rung, StepPolicy
from autoclusters.core.quarantine import VerifyQuarantineInput
from autoclusters.core.settings import Settings
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import proven
from tests.fakes.systems import FakeSlurm
from tests.helpers import cancel, eventually, job, running, submit_progress_job
from tests.on_sandbox.test_incident_on_sandbox import fresh_policy
from tests.workflows.test_remediation_workflow import (
    APPROVED_RUNBOOK,
    STEPS,
    _app_error,
    _approval_pending,
    _approve,
    _fleet,
    _our_reason,
    _policy,
    _until,
)

ADMIN_REASON = "bad cable, keep out -- alice"


# --- the workflow ----------------------------------------------------------------------------


async def test_undrained_during_approval_is_quarantined_again_before_the_repair(
    env: WorkflowEnvironment,
) -> None:
    # A long idle wait: the job that cannot be requeued ends on its own, mid-wait.
    steps = {**STEPS, Rung.REBOOT: StepPolicy(idle_timeout_s=60)}
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve", steps=steps))
        handle = await _approval_pending(f, req)
        assert f.slurm.requeue_count == {101: 1}

        # While the humans think: an admin resumes the node and Slurm fills it again.
        f.slurm.admin_resume("gpu-01")
        f.slurm.add_job(201, nodes="gpu-01")  # requeueable
        f.slurm.add_job(202, nodes="gpu-01", requeue=False)  # sbatch --no-requeue
        await _approve(handle, "reboot")

        # Quarantined again and waiting for the node to be idle: nothing repaired yet.
        during = await _until(
            handle,
            lambda st: (
                st.step("requarantine") is not None
                and st.waiting_for is not None
                and st.waiting_for.kind == "idle"
            ),
            "the second wait for idle",
        )
        assert during.current_step == "wait_idle"
        assert f.cloud.repair_calls == []
        node = f.slurm.node_now("gpu-01")
        assert node.drained and node.reason == _our_reason(req)
        assert f.slurm.requeue_count == {101: 1, 201: 1}
        assert f.slurm.job_now(202).job_state == "RUNNING"

        f.slurm.finish_job(202)
        result = await handle.result()

    assert result.status == "resolved"
    assert (
        [s.name for s in result.steps]
        == [
            *APPROVED_RUNBOOK[:10],  # ... approval, notify_approval_needed, admit_repair
            "notify_quarantine_lost",
            "requarantine",
            "drain",
            "requeue",  # the silence of the first quarantine holds: not asked again
            "wait_idle",
            *APPROVED_RUNBOOK[10:],  # repair, wait_registered, health_gate, ...
        ]
    )
    again = result.step("requarantine")
    assert again is not None and again.outcome == "ok"
    assert "IDLE" not in again.detail and "running jobs [201, 202]" in again.detail
    # Each job requeued exactly once in the incident; the new one carries our marker.
    assert f.slurm.requeue_count == {101: 1, 201: 1}
    assert f.slurm.job_now(201).admin_comment == requeue_marker(req.incident_id, 0)
    assert f.slurm.job_now(201).restart_cnt == 1
    assert sorted(result.requeued_jobs) == [101, 201]
    # Each requeue's plans are kept (issue 42: the close measures every planned job).
    assert sorted(p.job_id for p in result.recovery_plans) == [101, 201]
    # The order on the cluster: drained again, requeued, idle, and only then the reboot.
    log = f.slurm.log
    assert log.index(("admin_resume", "gpu-01")) < log.index(("requeue", "201"))
    assert log[log.index(("admin_resume", "gpu-01")) + 1] == ("drain", "gpu-01")
    assert log.index(("requeue", "201")) < log.index(("completed", "202"))
    assert log.index(("completed", "202")) < log.index(("cloud.reboot", "gpu-01"))
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT]
    assert f.events() == ["opened", "approval_needed", "quarantine_lost", "resolved"]
    assert not f.slurm.node_now("gpu-01").drained


async def test_a_drain_by_someone_else_stops_the_incident_before_the_repair(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)
        f.slurm.set_reason("gpu-01", ADMIN_REASON)  # an admin takes the node over
        await _approve(handle, "reboot")
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)
        guard = (await f.guard_status()).state

    assert "someone else holds it" in _app_error(caught.value, "RemediationFailed").message
    assert state.status == "failed"
    assert f.cloud.repair_calls == []
    assert state.step("repair") is None and state.step("requarantine") is None
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == ADMIN_REASON  # their drain stands
    assert f.slurm.calls["resume"] == 0
    assert f.events() == ["opened", "approval_needed", "failed"]
    assert f.notes()[-1].severity == "critical"
    assert guard.repairing == {}


async def test_a_node_that_does_not_go_idle_again_is_left_drained(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:  # idle_timeout_s 0.5, then leave drained
        req = f.request(policy=_policy(mode="approve"))
        handle = await _approval_pending(f, req)
        f.slurm.admin_resume("gpu-01")
        f.slurm.add_job(203, nodes="gpu-01", requeue=False)
        await _approve(handle, "reboot")
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    assert "still runs jobs [203]" in _app_error(caught.value, "NodeBusy").message
    assert state.status == "failed"
    again = state.step("requarantine")
    assert again is not None and again.outcome == "failed"
    assert f.cloud.repair_calls == []
    assert state.step("repair") is None
    assert f.slurm.job_now(203).job_state == "RUNNING"  # never repaired under, never killed
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(req)
    assert f.events() == ["opened", "approval_needed", "quarantine_lost", "failed"]


async def test_long_steps_carry_a_heartbeat_timeout_of_at_most_10s(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        handle = await f.start(f.request())
        assert (await handle.result()).status == "resolved"
        history = await handle.fetch_history()

    scheduled = {
        e.activity_task_scheduled_event_attributes.activity_type.name: (
            e.activity_task_scheduled_event_attributes.heartbeat_timeout.ToTimedelta()
        )
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    expected = {
        "guard_register",
        "guard_admit_quarantine",
        "guard_admit_repair",
        "guard_release",
        "notify",
        "drain_node",
        "requeue_jobs",
        "wait_node_idle",
        "verify_quarantine",
        "repair_node",
        "wait_node_registered",
        "return_to_service",
    }
    assert expected <= scheduled.keys()
    for name in expected:
        assert timedelta(0) < scheduled[name] <= timedelta(seconds=10), name


# --- the activities --------------------------------------------------------------------------


def _verify(slurm: FakeSlurm, *reasons: str) -> VerifyQuarantineInput:
    return VerifyQuarantineInput(
        node="gpu-01", incident_id="INC-1", reasons=list(reasons or ["autoclusters: INC-1 X"])
    )


async def test_verify_quarantine_reports_what_it_finds() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    acts, run = SlurmActivities(slurm), ActivityEnvironment().run
    ours = "autoclusters: INC-1 XID_79"

    await slurm.drain("gpu-01", ours)
    found = await run(acts.verify_quarantine, _verify(slurm, ours))
    assert found.intact and found.restorable
    assert (found.state, found.reason, found.busy_jobs) == ("IDLE+DRAIN", ours, [])

    # Undrained, and a job landed: lost, and ours to take back.
    slurm.admin_resume("gpu-01")
    slurm.add_job(301, nodes="gpu-01")
    slurm.add_job(302, nodes="gpu-01", job_state="COMPLETING")
    slurm.add_job(303, nodes="gpu-01", job_state="PENDING")
    found = await run(acts.verify_quarantine, _verify(slurm, ours))
    assert not found.intact and found.restorable and not found.drained
    assert found.busy_jobs == [301, 302]
    assert found.describe() == "ALLOCATED, running jobs [301, 302]"

    # Drained by us again, but the job still runs: not intact yet.
    await slurm.drain("gpu-01", ours)
    found = await run(acts.verify_quarantine, _verify(slurm, ours))
    assert found.ours and not found.intact

    # Someone else's drain: not ours, not to be taken over.
    slurm.set_reason("gpu-01", ADMIN_REASON)
    found = await run(acts.verify_quarantine, _verify(slurm, ours))
    assert not found.ours and not found.restorable
    # ... unless it was the drain the incident found and kept.
    found = await run(acts.verify_quarantine, _verify(slurm, ours, ADMIN_REASON))
    assert found.ours

    # Slinky's operator copies the cordon reason into Slurm under its own prefix.
    slurm.set_reason("gpu-01", f"slurm-operator: {ours}")
    found = await run(acts.verify_quarantine, _verify(slurm, ours))
    assert found.ours
    # Another incident of ours is not this one.
    slurm.set_reason("gpu-01", "autoclusters: INC-12 XID_79")
    found = await run(acts.verify_quarantine, _verify(slurm, ours))
    assert not found.ours


class _SlowSlurm(FakeSlurm):
    """`scontrol update ... State=DRAIN` hangs until the test lets it finish."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = asyncio.Event()
        self.go = asyncio.Event()

    async def drain(self, node: str, reason: str) -> None:
        self.entered.set()
        await self.go.wait()
        await super().drain(node, reason)


async def test_a_slow_slurm_call_keeps_heartbeating() -> None:
    slurm = _SlowSlurm()
    slurm.add_node("gpu-01")
    beats: list[object] = []
    two_beats = asyncio.Event()

    def beat(*details: object) -> None:
        beats.extend(details)
        if len(beats) >= 2:
            two_beats.set()

    env = ActivityEnvironment()
    env.on_heartbeat = beat
    task = asyncio.create_task(
        env.run(SlurmActivities(slurm).drain_node, DrainInput(node="gpu-01", reason="r"))
    )
    await asyncio.wait_for(slurm.entered.wait(), timeout=10)
    # Two beats while the call is stuck (they come every 2 s): a live worker is visible.
    await asyncio.wait_for(two_beats.wait(), timeout=10)
    assert not task.done()
    assert beats[0] == "drain_node gpu-01"
    slurm.go.set()
    result = await asyncio.wait_for(task, timeout=10)
    assert not result.already_drained
    assert slurm.node_now("gpu-01").reason == "r"


# --- on the real sandbox ---------------------------------------------------------------------


@pytest.mark.integration
async def test_on_the_sandbox_a_job_started_during_approval_is_requeued_once_before_the_repair(
    sandbox: SandboxConfig, sandbox_settings: Settings, sandbox_client: Client, slurm: SlurmCli
) -> None:
    nodes = [n for n in await slurm.nodes() if n.display_state == "IDLE"]
    assert nodes, "no idle node in the sandbox"
    node = nodes[-1].name
    opened = await incidents.open_incident(
        sandbox_client,
        sandbox_settings,
        node,
        "ROW_REMAP_FAILURE",  # straight to replace
        policy=fresh_policy(mode="approve"),
    )
    handle = sandbox_client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )

    async def waiting() -> IncidentState | None:
        st = await handle.query(NodeRemediation.status)
        return st if st.waiting_for and st.waiting_for.kind == "approval" else None

    await eventually(waiting, 120, "the approval gate")
    # While the humans think: an admin undrains the node and a job starts on it.
    await slurm.resume(node)
    job_id = submit_progress_job(sandbox, "--nodes=1", f"--nodelist={node}")
    try:
        started = await eventually(lambda: running(slurm, job_id), 60, "job running")
        assert started.nodes == node and started.restart_cnt == 0

        # As the sandbox's API would send it (its key signs the proof of who decided).
        key = api_tokens.read(sandbox, api_tokens.APPROVAL_KEY)
        decision = await proven(handle, "replace", "alice", key=key)
        await handle.execute_update(NodeRemediation.approve, decision)
        state = await handle.result()

        assert state.status == "resolved", state.error
        names = [s.name for s in state.steps]
        repair = state.step("repair")
        again = state.step("requarantine")
        assert again is not None and again.outcome == "ok" and repair is not None
        assert f"running jobs [{job_id}]" in again.detail
        # Drained, requeued and idle again, all before the machine was touched.
        after_approval = names[names.index("requarantine") :]
        assert after_approval[:6] == [
            "requarantine", "drain", "requeue", "notify_recovery_chosen", "wait_idle", "repair",
        ]  # fmt: skip
        idle = [s for s in state.steps if s.name == "wait_idle"][-1]
        assert idle.finished_at is not None and idle.finished_at <= repair.started_at
        assert job_id in state.requeued_jobs
        assert state.old_vm_id and state.new_vm_id and state.old_vm_id != state.new_vm_id
        # Requeued exactly once, under this incident's marker.
        after = await job(slurm, job_id)
        assert after is not None and after.restart_cnt == 1, after
        assert after.admin_comment == requeue_marker(opened.incident_id, 0)
        back = await slurm.node(node)
        assert back is not None and not back.drained
    finally:
        cancel(sandbox, job_id)
