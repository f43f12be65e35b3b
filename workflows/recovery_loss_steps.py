"""The measured loss beside the estimate (issue 42): when an incident closes under a
policy with `measure_recovery`, one step reads what each job it planned for says of its
recovery (activities/recovery_loss.py) and records its actual GPU-hours lost beside the
planner's estimate (core/recovery_loss.py); the closing message carries both.

A part of the close, never a reason for it to fail: a measuring step that fails leaves the
losses unknown, said so, and the incident closes as it would have.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.recovery_loss import (
        JobSighting,
        MeasureRecoveryInput,
        WatchedJob,
        actual_loss,
        loss_text,
    )

from autoclusters.workflows.incident import Incident

# Reads only: a few tries, then unknown (the close must not wait on an outage for long).
MEASURE_RETRY = RetryPolicy(maximum_attempts=3, initial_interval=timedelta(seconds=2))


async def measure_losses(inc: Incident) -> str:
    """Measure the planned jobs' losses onto the incident; what the closing message adds
    ("" when the policy does not measure or nothing was planned)."""
    s, p = inc.state, inc.policy
    if not p.measure_recovery or not s.recovery_plans or s.recovery_losses:
        return ""
    taken = {p_.job_id: s.recovery_path.get(p_.job_id, "requeue") for p_ in s.recovery_plans}
    opened = s.request.opened_at.timestamp()
    call = MeasureRecoveryInput(
        jobs=[
            WatchedJob(
                job_id=plan.job_id,
                path=taken[plan.job_id],
                restart_cnt=plan.restart_cnt,
                says_checkpoints=plan.checkpoint_at is not None or plan.says_progress,
            )
            for plan in s.recovery_plans
        ],
        opened_at=opened,
        fault_at=s.loss_starts().timestamp(),
        budget_s=p.measure_recovery_s,
    )
    try:
        done = await inc.steps.activity(
            "measure_recovery",
            contracts.measure_recovery,
            call,
            f"measure what the jobs of {s.request.node} lost",
            lambda r: r.describe(),
            timeout=timedelta(seconds=p.measure_recovery_s + 60),
            retry=MEASURE_RETRY,
        )
        seen = {x.job_id: x for x in done.seen}
    except (ActivityError, ApplicationError) as err:
        why = f"not measured: {err.cause or err}"
        seen = {j.job_id: JobSighting(job_id=j.job_id, why_unknown=why) for j in call.jobs}
    s.recovery_losses = [
        actual_loss(plan, taken[plan.job_id], seen[plan.job_id], call.lost_from)
        for plan in s.recovery_plans
    ]
    return "\n" + loss_text(s.recovery_losses)
