"""The first runbook (v1), frozen: incidents started before the policy ladder replay and
finish on it. Do not change what it schedules or in which order.

notify → drain → requeue → replace → wait until registered → return to service → close.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import (
        DrainInput,
        IncidentRequest,
        IncidentState,
        ReplaceInput,
        RequeueInput,
        ReturnInput,
        WaitRegisteredInput,
        drain_reason,
    )

from autoclusters.workflows.timeline import RETRY, Timeline


async def run_v1(wf: Timeline, req: IncidentRequest) -> IncidentState:
    state = wf._state
    t = req.timeouts
    slurm = timedelta(seconds=t.slurm_step_s)

    await wf._notify("opened", f"fault {req.fault} on {req.node}; remediation started")
    try:
        await wf._step(
            "drain",
            lambda: workflow.execute_activity(
                contracts.drain_node,
                DrainInput(node=req.node, reason=drain_reason(req.incident_id, req.fault)),
                start_to_close_timeout=slurm,
                retry_policy=RETRY,
            ),
        )
        requeued = await wf._step(
            "requeue",
            lambda: workflow.execute_activity(
                contracts.requeue_jobs,
                RequeueInput(node=req.node, incident_id=req.incident_id),
                start_to_close_timeout=slurm,
                retry_policy=RETRY,
            ),
            detail=lambda r: f"requeued {r.requeued or 'no jobs'}",
        )
        state.requeued_jobs = requeued.requeued
        repair = await wf._step(
            "repair",
            lambda: workflow.execute_activity(
                contracts.replace_node,
                ReplaceInput(node=req.node, incident_id=req.incident_id),
                start_to_close_timeout=timedelta(seconds=t.repair_s),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RETRY,
            ),
            detail=lambda r: f"{r.old_vm_id} -> {r.new_vm_id}",
        )
        state.old_vm_id, state.new_vm_id = repair.old_vm_id, repair.new_vm_id
        await wf._step(
            "wait_registered",
            lambda: workflow.execute_activity(
                contracts.wait_node_registered,
                WaitRegisteredInput(node=req.node, since=repair.stopped_at),
                start_to_close_timeout=timedelta(seconds=t.wait_registered_s),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RETRY,
            ),
            detail=lambda n: n.display_state,
        )
        back = await wf._step(
            "return_to_service",
            lambda: workflow.execute_activity(
                contracts.return_to_service,
                ReturnInput(node=req.node, incident_id=req.incident_id),
                start_to_close_timeout=slurm,
                retry_policy=RETRY,
            ),
            detail=lambda r: r.state_after + (f" ({r.detail})" if r.detail else ""),
        )
        if not back.returned:
            raise ApplicationError(f"{req.node} not returned to service: {back.detail}")
    except (ActivityError, ApplicationError) as err:
        cause = err.cause if isinstance(err, ActivityError) and err.cause else err
        state.status, state.error = "failed", str(cause)
        state.closed_at = workflow.now()
        drain = state.step("drain")
        left = "left drained" if drain and drain.outcome == "ok" else "not drained"
        await wf._notify("failed", f"{cause}; {req.node} {left}, needs a human")
        raise ApplicationError(
            f"remediation of {req.node} failed: {cause}",
            type="RemediationFailed",
            non_retryable=True,
        ) from err

    state.status, state.closed_at = "resolved", workflow.now()
    await wf._notify("resolved", "resolved; " + wf._timeline_text())
    return state
