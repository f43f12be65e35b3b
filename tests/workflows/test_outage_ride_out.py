"""The runbook waits out a dependency's outage instead of reading silence as truth.

slurmctld away (every Slurm call raises SlurmUnavailable, as SlurmCli does on the errors
document 22.05 prints while the controller is down) at the moments that broke it before:
while the incident waits for a job that may not be requeued (it must not repair under the
job, must stay open and keep the node drained, and must resolve once the job ends); past
the outage budget (it fails, and says what Slurm shows of the node); a drain the controller
lost; a job Slurm placed back on the node after its requeue (asked about, never requeued a
second time).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from autoclusters.core.models import RETURNED_JOBS_STEP, IncidentState
from autoclusters.core.policy import Rung, StepPolicy
from autoclusters.workflows.remediation import NodeRemediation
from tests.decisions import proven
from tests.workflows.test_remediation_workflow import (
    Fleet,
    Incident,
    _fleet,
    _our_reason,
    _policy,
    _until,
    _until_true,
)

pytestmark = pytest.mark.workflow

# Long enough that only the job's end, never the idle timeout, ends wait_idle here.
PATIENT = {r: StepPolicy(idle_timeout_s=3600) for r in (Rung.RESET_GPU, Rung.REBOOT, Rung.REPLACE)}


def _outage_shown(state: IncidentState, step: str, at_least_s: float) -> bool:
    rec = state.step(step)
    if rec is None or "slurmctld unreachable for " not in rec.detail:
        return False
    seconds = rec.detail.split("slurmctld unreachable for ", 1)[1].split(" ", 1)[0]
    return float(seconds) >= at_least_s


async def _job_comes_back(f: Fleet, handle: Incident) -> None:
    """Wait for the reboot's approval; an admin resumes the node meanwhile and Slurm puts
    the requeued job 101 straight back on it; then the reboot is approved."""
    await _until(
        handle,
        lambda s: s.waiting_for is not None and s.waiting_for.step == "reboot",
        "the approval wait",
    )
    assert f.slurm.requeue_count[101] == 1
    f.slurm.admin_resume("gpu-01")
    f.slurm.run_again(101, nodes="gpu-01")
    await handle.execute_update(NodeRemediation.approve, await proven(handle, "reboot", "alice"))


async def test_slurmctld_down_60s_during_wait_idle_repairs_nothing_under_the_job(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        f.slurm.add_job(105, nodes="gpu-01", requeue=False)  # sbatch --no-requeue
        req = f.request(policy=_policy(steps=PATIENT, outage_notify_after_s=30))
        handle = await f.start(req)
        await _until(handle, lambda s: s.current_step == "wait_idle", "wait_idle")
        f.slurm.down = True
        # The outage lasts a minute of the incident's time (the test server skips it).
        await env.sleep(65)
        during = await _until(
            handle, lambda s: _outage_shown(s, "wait_idle", 60), "a 60 s outage shown", 60
        )
        assert during.status == "open"
        # wait_idle kept asking through the outage (each try refused), not once and done.
        assert sum(f.slurm.calls_while_down.values()) >= 2, f.slurm.calls_while_down
        assert f.cloud.repair_calls == []
        assert "dependency_unavailable" in f.events()
        f.slurm.down = False

        # Back: the job still runs, so the incident still waits, with the node drained.
        await _until_true(lambda: f.slurm.calls["jobs_on_node"] > 2, "wait_idle reading again")
        state = await handle.query(NodeRemediation.status)
        assert state.status == "open" and state.current_step == "wait_idle"
        node = f.slurm.node_now("gpu-01")
        assert node.drained and node.reason == _our_reason(req)
        assert f.cloud.repair_calls == []
        assert f.slurm.job_now(105).job_state == "RUNNING"

        f.slurm.finish_job(105)
        result = await handle.result()

    assert result.status == "resolved"
    idle = result.step("wait_idle")
    assert idle is not None and idle.outcome == "ok"
    assert "slurmctld unreachable for " in idle.detail, idle.detail
    assert f.slurm.calls["cancel"] == 0  # waited for it, never cancelled it
    assert f.slurm.requeue_count[105] == 0
    assert len(f.cloud.repair_calls) == 1
    # Every action on the node came after the job ended.
    assert f.slurm.log.index(("completed", "105")) < f.slurm.log.index(("cloud.reboot", "gpu-01"))
    assert "dependency_back" in f.events()


async def test_an_outage_past_the_budget_fails_the_incident_with_the_node_drained(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        f.slurm.add_job(105, nodes="gpu-01", requeue=False)
        req = f.request(policy=_policy(steps=PATIENT, outage_budget_s=30))
        handle = await f.start(req)
        await _until(handle, lambda s: s.current_step == "wait_idle", "wait_idle")
        f.slurm.down = True
        await env.sleep(40)
        # The closing read back waits for Slurm too: it comes back once the step fails.
        await _until(handle, lambda s: s.step("verify_drained") is not None, "closing read", 60)
        f.slurm.lose_drain("gpu-01")  # and it came back from an older state
        f.slurm.down = False
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    assert state.status == "failed"
    assert "over the outage budget of 30 s" in (state.error or "")
    assert f.cloud.repair_calls == []
    # The lost drain was applied again before the incident said "left drained".
    redrain = state.step("redrain")
    assert redrain is not None and redrain.outcome == "ok"
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(req)
    assert "gpu-01 left drained under" in f.notes()[-1].text


async def test_a_drain_lost_during_wait_idle_is_applied_again(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        f.slurm.add_job(105, nodes="gpu-01", requeue=False)
        req = f.request(policy=_policy(steps=PATIENT))
        handle = await f.start(req)
        await _until(handle, lambda s: s.current_step == "wait_idle", "wait_idle")
        f.slurm.lose_drain("gpu-01")
        await _until_true(lambda: f.slurm.node_now("gpu-01").drained, "the drain applied again")
        f.slurm.finish_job(105)
        result = await handle.result()

    assert result.status == "resolved"
    idle = result.step("wait_idle")
    assert idle is not None and "the drain was lost and applied again x1" in idle.detail
    lost = f.slurm.log.index(("drain_lost", "gpu-01"))
    assert ("drain", "gpu-01") in f.slurm.log[lost + 1 :]  # drained again after the loss


async def test_a_job_back_on_the_node_is_not_requeued_twice_and_a_human_cancels_it(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve", steps=PATIENT))
        handle = await f.start(req)
        await _job_comes_back(f, handle)
        await _until(
            handle,
            lambda s: s.waiting_for is not None and s.waiting_for.step == RETURNED_JOBS_STEP,
            "the question about job 101",
        )
        assert f.cloud.repair_calls == []

        def question() -> list[Any]:  # posted by an activity once the wait began
            return [
                n
                for n in f.notes()
                if n.event == "approval_needed" and n.text.startswith(RETURNED_JOBS_STEP)
            ]

        await _until_true(lambda: bool(question()), "the question posted to Slack")
        asked = question()[-1]
        assert asked.text.startswith(f"{RETURNED_JOBS_STEP} of gpu-01 needs approval")
        assert "[101]" in asked.text
        await handle.execute_update(
            NodeRemediation.approve, await proven(handle, RETURNED_JOBS_STEP, "bob")
        )
        result = await handle.result()

    assert result.status == "resolved"
    assert f.slurm.requeue_count[101] == 1  # once for this fault, never twice
    assert f.slurm.job_now(101).job_state == "CANCELLED"
    requeues = [s for s in result.steps if s.name == "requeue"]
    assert "back on the node after their requeue, left running [101]" in requeues[-1].detail
    assert "requeued no jobs" in requeues[-1].detail
    cancel = result.step("cancel_jobs")
    assert cancel is not None and cancel.detail == "cancelled [101]"
    assert f.slurm.log.index(("cancel", "101")) < f.slurm.log.index(("cloud.reboot", "gpu-01"))


async def test_without_a_decision_the_returned_job_leaves_the_node_drained(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        policy = _policy(mode="approve", steps=PATIENT, returned_jobs_timeout_s=60)
        req = f.request(policy=policy)
        handle = await f.start(req, execution_timeout=timedelta(hours=2))
        await _job_comes_back(f, handle)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    assert state.status == "failed"
    assert "no decision on jobs [101]" in (state.error or "")
    assert f.cloud.repair_calls == []
    assert f.slurm.job_now(101).job_state == "RUNNING"  # nobody said cancel: left alone
    assert f.slurm.requeue_count[101] == 1
    assert f.slurm.node_now("gpu-01").drained


async def test_policy_requeue_requeues_a_returned_job_a_second_time(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve", steps=PATIENT, returned_jobs="requeue"))
        handle = await f.start(req)
        await _job_comes_back(f, handle)
        result = await handle.result()

    assert result.status == "resolved"
    assert f.slurm.requeue_count[101] == 2  # the policy said so
    again = result.step("requeue_again")
    assert again is not None and "requeued a second time [101]" in again.detail


async def test_a_job_placed_back_during_the_idle_wait_ends_the_wait_for_a_decision(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain is lost while the runbook waits for the node to go idle (a controller
    that came back without it) and Slurm puts requeued job 101 back on the node: the wait
    hands it to the returned-jobs decision at once (here the policy's: requeue again),
    rather than waiting an idle timeout out for it."""
    async with _fleet(env) as f:
        real = f.slurm.jobs_on_node
        looks = 0

        async def jobs_on_node(node: str) -> list[Any]:
            nonlocal looks
            looks += 1
            if looks == 2:  # the idle wait's first look, after the requeue's
                f.slurm.admin_resume("gpu-01")
                f.slurm.run_again(101, nodes="gpu-01")
            return await real(node)

        monkeypatch.setattr(f.slurm, "jobs_on_node", jobs_on_node)
        req = f.request(policy=_policy(steps=PATIENT, returned_jobs="requeue"))
        result = await (await f.start(req)).result()

    assert result.status == "resolved", result.error
    assert f.slurm.requeue_count[101] == 2  # the policy said so
    waited = result.step("wait_idle")
    assert waited is not None and "jobs [101] were placed on the node again" in waited.detail
    again = result.step("requeue_again")
    assert again is not None and "requeued a second time [101]" in again.detail
    lost = f.slurm.log.index(("admin_resume", "gpu-01"))
    assert ("drain", "gpu-01") in f.slurm.log[lost:]  # drained again after the loss
    assert not f.slurm.node_now("gpu-01").drained  # returned after its repair
