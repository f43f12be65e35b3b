"""Re-verify the quarantine right before every destructive step.

Between the first quarantine and a reboot or replacement the incident can wait a long time
(an approval, the fleet guard's admission). Meanwhile a human or a tool may undrain the node
(`scontrol update nodename=X state=resume`), Slurm may schedule a job on it, or someone may
uncordon its Kubernetes Node. Right before the repair the runbook checks again that the node
is still drained for this incident, runs no job and (Slinky) is still cordoned. If not, it
quarantines again (drain, requeue what landed there, wait for idle, cordon) and checks once
more; where that is impossible (someone else drained it since, under another reason; the
node does not go idle) it stops, leaves the node drained and pages a human. A machine that
runs a job is never power-cycled or deleted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.cluster_ops import is_ops_reason
    from autoclusters.core.models import (
        FENCE_AFTER_S,
        CancelJobsInput,
        CheckpointInput,
        DrainInput,
        DrainResult,
        RequeueInput,
        SilenceInput,
        WaitIdleInput,
        WaitIdleResult,
        Waiting,
        drain_reason,
    )
    from autoclusters.core.policy import Rung
    from autoclusters.core.quarantine import QuarantineStatus, VerifyQuarantineInput
    from autoclusters.core.recovery_capacity import capacity_for
    from autoclusters.core.recovery_cost import RecoveryFigures, recovery_text
    from autoclusters.core.sharing import YieldCall, is_sharing_reason

from autoclusters.workflows.approvals import Approvals
from autoclusters.workflows.incident import Incident, Rejected
from autoclusters.workflows.kubernetes_steps import KubernetesNode
from autoclusters.workflows.recovery_figures_steps import figures_for_plan
from autoclusters.workflows.steps import cause_of

# 0.2: the incident silences its node's other alerts after the requeue; 0.1's runs did not
# (no silence step, none to lift at the close). docs/versioning.md.
SILENCE_PATCH = "remediation-0.2-maintenance-silence"


@dataclass
class Found:
    slurm: QuarantineStatus
    cordoned: bool | None  # None off Kubernetes

    @property
    def intact(self) -> bool:
        return self.slurm.intact and self.cordoned is not False

    def describe(self) -> str:
        text = self.slurm.describe()
        return text + ("; Kubernetes Node not cordoned" if self.cordoned is False else "")


class Quarantine:
    """The node out of service for the incident: drained under its reason, its jobs
    requeued, idle, (Slinky) cordoned and emptied; checked again before every repair and
    read back before the incident closes."""

    def __init__(
        self, incident: Incident, approvals: Approvals, k8s: KubernetesNode | None
    ) -> None:
        self.incident = incident
        self.approvals = approvals
        self.k8s = k8s
        # What to do when slurmctld restarted during the idle wait (the runbook sets it:
        # workflows/controller_restart.py); says what it did.
        self.on_restart: Callable[[], Awaitable[str]] | None = None

    async def take(self) -> None:
        """Drain, requeue, wait until idle, cordon."""
        # The figures the recovery plan weighs, read from the cluster's history while the
        # node is drained: beside the drain, not before the jobs' requeue.
        p = self.incident.policy
        reading = (
            asyncio.ensure_future(figures_for_plan(self.incident, p.figures_from_history))
            if p.figures_from_history is not None
            else None
        )
        try:
            await self._take(reading)
        finally:
            if reading is not None and not reading.done():
                reading.cancel()  # the incident stopped before its requeue

    async def _take(self, reading: asyncio.Future[tuple[RecoveryFigures, str]] | None) -> None:
        inc = self.incident
        req, s = inc.request, inc.state
        drain = await inc.steps.step(
            "drain",
            self.drain,
            detail=lambda r: (
                f"kept the drain already there: {r.previous_reason}"
                if r.previous_reason and r.already_drained
                else ""
            ),
        )
        inc.note_drain(drain)
        if drain.already_drained and is_ops_reason(drain.previous_reason):
            raise Rejected(f"{req.node} is owned by {drain.previous_reason!r} (scale/teardown)")
        if drain.already_drained and is_sharing_reason(drain.previous_reason):
            # Lent to inference or moving: the sharing workflow lets the node go once its move's
            # current step is done; the move stops there and the runbook goes on.
            await inc.steps.activity(
                "take_from_sharing",
                contracts.share_yield_node,
                YieldCall(cluster=req.cluster, node=req.node, incident_id=req.incident_id),
                f"take {req.node} back from GPU sharing",
                lambda r: (
                    f"was {r.pool_before}"
                    + (f"; waited for {r.waited_for_step}" if r.waited_for_step else "")
                    if r.held
                    else "GPU sharing did not hold it"
                ),
                timeout=timedelta(minutes=15),
            )
        if inc.policy.rule_for(req.fault).on_degraded == "checkpoint_then_drain":
            await self._checkpoint()
        p = inc.policy
        in_job = p.job_recovery == "in-job"
        figures, figures_from = await reading if reading is not None else (p.recovery_figures, "")
        requeued = await inc.steps.activity(
            "requeue",
            contracts.requeue_jobs,
            RequeueInput(
                node=req.node,
                incident_id=req.incident_id,
                in_job=in_job,
                in_job_budget_s=p.in_job_budget_s,
                standby_holders=p.standby_holders,
                drain_reason=drain_reason(req.incident_id, req.fault),
                figures=figures,
                capacity=capacity_for(p, req.fault, s.rung),
                fault_at=s.loss_starts().timestamp(),
                fence_after_s=0.0 if p.rule_for(req.fault).fence == "at_once" else FENCE_AFTER_S,
            ),
            f"requeue the jobs on {req.node}",
            lambda r: r.describe(),
            timeout=timedelta(seconds=p.in_job_budget_s + 300) if in_job else None,
        )
        s.requeued_jobs = requeued.requeued
        known = {j.job_id for j in s.job_records}
        s.job_records += [j for j in requeued.records if j.job_id not in known]
        # The controller's start when the jobs were first requeued: a later one means it
        # restarted since (workflows/controller_restart.py compares, and moves it on).
        s.controller_started = s.controller_started or requeued.controller_started
        s.recovery_path = requeued.recovery_path()
        for plan in requeued.plans:
            plan.figures_from = figures_from  # what the plan weighed, and why
        # A second quarantine (the node was undrained meanwhile) plans only the jobs it
        # requeues: the first one's plans stay, for the loss measured at the close.
        again = {p.job_id for p in requeued.plans}
        s.recovery_plans = [p for p in s.recovery_plans if p.job_id not in again] + requeued.plans
        if p.announce_recovery and requeued.plans:
            # Only a policy that says so: a run whose snapshot predates the field (False)
            # issues no new command on replay (docs/versioning.md).
            await inc.notify("recovery_chosen", recovery_text(requeued.plans), "info")
        if requeued.came_back:
            await self.returned_jobs(requeued.came_back)
        # After the jobs are on their way (their restart never waits for it), before the
        # idle wait and the repair that make the node's exporters go away.
        if s.step("silence") is None and workflow.patched(SILENCE_PATCH):
            await self._silence()
        # Jobs that could not be requeued still run here: never repair under them, unless
        # the policy says force.
        await inc.steps.step("wait_idle", self.wait_idle, lambda r: r.describe())
        if self.k8s is not None:
            await self.k8s.quarantine(inc.policy.step(Rung(s.rung or Rung.REBOOT.value)))

    async def wait_idle(self) -> WaitIdleResult:
        """Until the node runs nothing: within the rung's idle timeout, then as the policy
        says (leave it drained, or cancel what still runs). A controller that restarted
        meanwhile ends the wait: what it forgot is re-established (`on_restart`), and the
        wait goes on, so a requeue it lost is never waited out as a running job."""
        inc = self.incident
        req, s = inc.request, inc.state
        first = inc.policy.step(Rung(s.rung or Rung.REBOOT.value))
        s.waiting_for = Waiting(kind="idle", detail="jobs still on the node", since=workflow.now())
        force = not first.wait_for_idle or first.on_idle_timeout == "force"
        rechecked: list[str] = []
        redrained, asked = 0, False
        while True:
            done = await inc.steps.call(
                contracts.wait_node_idle,
                WaitIdleInput(
                    node=req.node,
                    timeout_s=first.idle_timeout_s if first.wait_for_idle else 0,
                    force=force,
                    drain_reason=drain_reason(req.incident_id, req.fault),
                    controller_started=s.controller_started,
                    incident_id=req.incident_id if not asked else "",
                ),
                f"wait until {req.node} is idle" + (" (then cancel what runs)" if force else ""),
                timeout=timedelta(seconds=first.idle_timeout_s + 120),
            )
            redrained += done.redrained
            s.cancelled_jobs = sorted({*s.cancelled_jobs, *done.cancelled})
            if done.came_back:  # the drain was lost and Slurm placed them here again
                rechecked.append(f"jobs {done.came_back} were placed on the node again")
                await self.returned_jobs(done.came_back)
                asked = True  # decided once (requeued, cancelled, or waited for)
            elif done.controller_restarted and self.on_restart is not None:
                rechecked.append(await self.on_restart())
            else:
                break
        s.waiting_for = None
        return done.model_copy(update={"redrained": redrained, "rechecked": rechecked})

    async def _silence(self) -> None:
        """The node's other alerts silenced in Alertmanager until the incident closes
        (activities/silences.py); Alertmanager away: noted, and the runbook goes on."""
        inc = self.incident
        req = inc.request
        done = await inc.steps.activity(
            "silence",
            contracts.silence_node_alerts,
            SilenceInput(node=req.node, incident_id=req.incident_id, fault=req.fault),
            f"silence the other alerts of {req.node} in Alertmanager",
            lambda r: r.detail,
        )
        inc.state.silence_id = done.silence_id

    async def _checkpoint(self) -> None:
        """A degraded node still runs its jobs: ask them to checkpoint and requeue
        themselves before the requeue (activities/checkpoint.py), so they lose no steps."""
        inc = self.incident
        req, p = inc.request, inc.policy
        s = inc.state
        s.waiting_for = Waiting(
            kind="checkpoint", detail="jobs checkpointing before the requeue", since=workflow.now()
        )
        done = await inc.steps.activity(
            "checkpoint",
            contracts.checkpoint_jobs,
            CheckpointInput(
                node=req.node,
                incident_id=req.incident_id,
                signal=p.checkpoint_signal,
                budget_s=p.checkpoint_budget_s,
            ),
            f"ask the jobs on {req.node} to checkpoint ({req.fault} is degraded, not fatal)",
            lambda r: r.describe(),
            timeout=timedelta(seconds=p.checkpoint_budget_s + 120),
        )
        s.waiting_for = None
        s.checkpointed_jobs = done.checkpointed

    async def drain(self) -> DrainResult:
        """Drain the node under this incident's reason (the activity reads it back)."""
        r = self.incident.request
        return await self.incident.steps.call(
            contracts.drain_node,
            DrainInput(node=r.node, reason=drain_reason(r.incident_id, r.fault)),
            f"drain {r.node} ({r.fault})",
        )

    async def returned_jobs(self, jobs: list[int]) -> None:
        """Jobs this incident requeued once are running on the node again (its drain was
        lost, e.g. an admin resumed it during a wait). Never a second requeue for one fault
        unless the policy says so: otherwise a human decides in Slack, cancel them or wait
        for them to end, within `returned_jobs_timeout_s` (not the idle timeout)."""
        inc = self.incident
        req, s = inc.request, inc.state
        if inc.policy.returned_jobs == "requeue":
            again = await inc.steps.activity(
                "requeue_again",
                contracts.requeue_jobs,
                RequeueInput(node=req.node, incident_id=req.incident_id, requeue_again=True),
                f"requeue jobs {jobs} on {req.node} again",
                lambda r: r.describe(),
            )
            s.requeued_jobs = sorted({*s.requeued_jobs, *again.requeued})
            return
        if await self.approvals.returned_jobs(jobs):
            await self.cancel(jobs)

    async def cancel(self, jobs: list[int]) -> None:
        """Cancel the jobs still on the node, and remember them (a controller that restarts
        may show them again: they are cancelled again, never requeued)."""
        inc = self.incident
        req, s = inc.request, inc.state
        done = await inc.steps.activity(
            "cancel_jobs",
            contracts.cancel_jobs,
            CancelJobsInput(node=req.node, job_ids=jobs),
            f"cancel jobs {jobs} on {req.node}",
            lambda r: (
                f"cancelled {r.cancelled or 'none'}"
                + (f"; already gone {r.gone}" if r.gone else "")
            ),
        )
        s.cancelled_jobs = sorted({*s.cancelled_jobs, *done.cancelled})

    async def recheck(self) -> None:
        """Call right before a reboot or replacement (after every wait)."""
        inc = self.incident
        r = inc.request
        found = await self.now()
        if found.intact:
            return
        what = found.describe()
        if not found.slurm.restorable:
            raise ApplicationError(
                f"{r.node} is no longer quarantined for {r.incident_id} ({what}): "
                "someone else holds it now; not repairing",
                type="QuarantineLost",
                non_retryable=True,
            )
        await inc.notify(
            "quarantine_lost",
            f"{r.node} lost its quarantine while the incident waited ({what}); "
            "quarantining it again before the repair",
            "warning",
        )
        await inc.steps.step("requarantine", self.take, detail=lambda _: what)
        again = await self.now()
        if not again.intact:
            raise ApplicationError(
                f"{r.node} could not be quarantined again for {r.incident_id} "
                f"({again.describe()}); not repairing",
                type="QuarantineLost",
                non_retryable=True,
            )

    async def now(self) -> Found:
        """What Slurm (and Kubernetes) show now; an outage is waited out, never read as
        "not drained" or "no jobs"."""
        return await self.incident.steps.ride_out("verify_quarantine", self._read)

    async def _read(self) -> Found:
        inc = self.incident
        r = inc.request
        reasons = [drain_reason(r.incident_id, r.fault)]
        if inc.kept_drain:
            reasons.append(inc.kept_drain)
        slurm = await inc.steps.call(
            contracts.verify_quarantine,
            VerifyQuarantineInput(node=r.node, incident_id=r.incident_id, reasons=reasons),
            f"is {r.node} still drained for {r.incident_id} and idle",
        )
        cordoned = await self.k8s.is_cordoned() if self.k8s is not None else None
        return Found(slurm=slurm, cordoned=cordoned)

    async def left_drained(self) -> str:
        """What the closing words may say about the node, read back from Slurm: a drain
        the controller lost is applied again first. Never assumed."""
        try:
            found = await self.incident.steps.step(
                "verify_drained", self._drained_again_if_lost, detail=lambda f: f.describe()
            )
        except (ActivityError, ApplicationError) as err:
            return f"drain state unknown ({cause_of(err)})"
        if found.drained and found.ours:
            return "left drained"
        if found.drained:
            return f"left drained by someone else ({found.reason!r})"
        return f"NOT drained ({found.state}) although the incident drained it"

    async def _drained_again_if_lost(self) -> QuarantineStatus:
        found = (await self.now()).slurm
        if found.drained or not found.restorable:
            return found
        await self.incident.steps.step(
            "redrain",
            self.drain,
            detail=lambda _: f"the drain was lost ({found.state}); applied again",
        )
        return (await self.now()).slurm
