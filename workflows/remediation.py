"""NodeRemediation: the runbook for one faulty node, one incident per node.

register with the fleet guard (recurrence, breaker) → notify → [observe: plan, stop]
[monitor-only fault: stop] → quarantine when admitted (drain) → requeue the node's jobs so
they restart at once elsewhere → wait until the node is idle (or force) → per rung of the
ladder reset_gpu → reboot → replace: [approval] → repair when admitted → wait until it
registers → health gate, one rung up on failure → return to service → close.

Never return a node that failed its health gate: a failed incident leaves the node drained
under a reason naming the incident and pages a human.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.cluster_ops import is_ops_reason
    from autoclusters.core.evidence import EvidenceAck, HealthSnapshot
    from autoclusters.core.fault_evidence import FaultCleared
    from autoclusters.core.guard import (
        GuardContext,
        IncidentOpened,
        RegisterCall,
        Registration,
    )
    from autoclusters.core.models import (
        RETURNED_JOBS_STEP,
        ApprovalRecord,
        ApprovalRequest,
        CancelJobsInput,
        DrainInput,
        DrainResult,
        FaultAck,
        FaultReport,
        FaultSeen,
        IncidentRequest,
        IncidentState,
        IncidentStatus,
        RefusedApproval,
        RepairInput,
        RepairResult,
        RequeueInput,
        RequeueResult,
        ReturnInput,
        WaitIdleInput,
        Waiting,
        WaitRegisteredInput,
        drain_reason,
    )
    from autoclusters.core.policy import LADDER, Policy, Rung, next_rung
    from autoclusters.core.quarantine import QuarantineStatus
    from autoclusters.core.sharing import YieldCall, is_sharing_reason
    from autoclusters.integrations import temporal

from autoclusters.workflows.fault_intake import FaultIntake
from autoclusters.workflows.guard_steps import GuardSteps
from autoclusters.workflows.health_gate_steps import HealthGateSteps
from autoclusters.workflows.kubernetes_steps import KubernetesSteps
from autoclusters.workflows.quarantine_check import QuarantineCheck
from autoclusters.workflows.recorded_vm import with_recorded_vm
from autoclusters.workflows.spare_steps import SpareSteps
from autoclusters.workflows.timeline import HEARTBEAT, STEP_RETRY, cause_of


class Rejected(Exception):
    """A human said no: the node stays drained, the incident ends `rejected`."""


class Unattended(Exception):
    """Nobody decided in time and the policy says leave the node drained."""


@workflow.defn
class NodeRemediation(
    QuarantineCheck, KubernetesSteps, SpareSteps, HealthGateSteps, FaultIntake, GuardSteps
):
    @workflow.init
    def __init__(self, req: IncidentRequest) -> None:
        # Built from the input so queries and updates see the incident from the first moment.
        self._state = IncidentState(
            request=req,
            faults=[
                FaultSeen(
                    fault=req.fault,
                    source=req.opened_by,
                    first_at=req.opened_at,
                    last_at=req.opened_at,
                )
            ],
        )
        self._policy = req.policy or Policy()
        self._recent = 0  # earlier incidents on this node within the recurrence window
        self._repairing = False
        self._decision: ApprovalRecord | None = None
        self._k8s = req.kubernetes
        self._report_keys: list[str] = []  # FaultIntake
        self._told_opened = False
        self._agent_snapshots: list[HealthSnapshot] = []  # HealthGateSteps
        self._agent_boots: dict[str, datetime] = {}
        self._guard_tickets: set[int] = set()

    # --- what people and other systems see and send -------------------------------------

    @workflow.query
    def status(self) -> IncidentState:
        return self._state

    @workflow.update
    def health_evidence(self, snap: HealthSnapshot) -> EvidenceAck:
        """A health snapshot from the node's agent (the API forwards them): kept for the
        health gate, which waits for a fresh healthy one after each repair."""
        return self._take_evidence(snap)

    @workflow.query
    def wants_evidence(self, snap: HealthSnapshot) -> bool:
        """Would `health_evidence` keep this snapshot? The API asks first: a query leaves
        no trace in the history, so the repeats of an incident held for days cost nothing."""
        return self._state.status == "open" and self._evidence_is_news(snap)

    @health_evidence.validator
    def _check_evidence(self, snap: HealthSnapshot) -> None:
        # A refused update leaves no event: repeats of what is known cost nothing.
        if self._state.status != "open":
            raise ValueError(f"incident {self._state.request.incident_id} is closed")
        if not self._evidence_is_news(snap):
            raise ValueError("nothing new: the same as the last snapshot kept")

    @workflow.update
    def report_fault(self, rep: FaultReport) -> FaultAck:
        """An alert for this node: merged into the open incident (no second drain)."""
        s = self._state
        ack, _ = self._merge_report(rep)
        # A more severe fault raises the rung of an incident that is not repairing yet.
        if not ack.repeat and s.rung is not None and not self._repairing:
            worse = self._policy.rung_for(rep.fault, self._recent)
            if LADDER.index(worse) > LADDER.index(Rung(s.rung)):
                s.rung = worse.value
                self._publish()
                ack = ack.model_copy(update={"rung": s.rung})
        return ack

    @workflow.update
    def fault_cleared(self, cleared: FaultCleared) -> bool:
        """A source says a fault stopped holding: recorded, never a reason to stop a repair."""
        return self._clear(cleared)

    @fault_cleared.validator
    def _check_fault_cleared(self, cleared: FaultCleared) -> None:
        self._check_cleared(cleared)

    @report_fault.validator
    def _check_report(self, rep: FaultReport) -> None:
        if self._state.status != "open":
            raise ValueError(f"incident {self._state.request.incident_id} is closed")

    @workflow.update
    def approve(self, req: ApprovalRequest) -> ApprovalRecord:
        return self._decide(req, approved=True)

    @approve.validator
    def _check_approve(self, req: ApprovalRequest) -> None:
        self._check_decision(req)

    @workflow.update
    def reject(self, req: ApprovalRequest) -> ApprovalRecord:
        return self._decide(req, approved=False)

    @reject.validator
    def _check_reject(self, req: ApprovalRequest) -> None:
        self._check_decision(req)

    @workflow.signal
    def approval_refused(self, refused: RefusedApproval) -> None:
        """A refused approve/reject, sent by the client so the attempt is in the history
        (a validator's refusal itself leaves no trace)."""
        self._state.refusals.append(refused)

    def _check_decision(self, req: ApprovalRequest) -> None:
        waiting = self._state.waiting_for
        if waiting is None or waiting.kind != "approval" or self._decision is not None:
            raise ValueError(
                f"incident {self._state.request.incident_id} is not waiting for a decision"
            )
        if req.step != waiting.step:
            raise ValueError(f"the decision waited for is on {waiting.step}, not {req.step}")
        if req.approver not in self._policy.approvers:
            raise ValueError(
                f"{req.approver} is not an approver for cluster {self._state.request.cluster}"
            )

    def _decide(self, req: ApprovalRequest, approved: bool) -> ApprovalRecord:
        self._decision = ApprovalRecord(
            step=req.step,
            approver=req.approver,
            approved=approved,
            comment=req.comment,
            at=workflow.now(),
        )
        self._state.approvals.append(self._decision)
        return self._decision

    # --- the runbook --------------------------------------------------------------------

    @workflow.run
    async def run(self, req: IncidentRequest) -> IncidentState:
        try:
            return await self._runbook(req)
        except BaseException as err:
            if self._cancelling(err):  # cancelled: give back the guard's slot, close
                await self._close_cancelled()
            raise

    async def _runbook(self, req: IncidentRequest) -> IncidentState:
        s, p = self._state, self._policy
        s.mode = p.mode
        guard = GuardContext(
            cluster=req.cluster, policy=p.guard, topology=p.topology, approvers=p.approvers
        )
        self._guard = guard

        reg = await self._step(
            "guard_register",
            lambda: workflow.execute_activity(
                contracts.guard_register,
                RegisterCall(
                    guard=guard,
                    incident=IncidentOpened(
                        node=req.node,
                        incident_id=req.incident_id,
                        fault=req.fault,
                        recurrence_window_s=p.recurrence_window_s,
                    ),
                ),
                start_to_close_timeout=timedelta(seconds=req.timeouts.slurm_step_s),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda r: (
                f"{r.recent_on_node} recent on node; "
                f"breaker {'TRIPPED' if r.breaker.tripped else 'ok'}"
            ),
        )
        self._recent = reg.recent_on_node
        s.rung = self._worst_rung().value
        self._publish()
        await self._notify("opened", self._opening_text(reg), self._severity())

        if p.mode == "observe":
            s.planned_steps = self._plan()
            return await self._close(
                "observed", "observe mode, nothing changed; would: " + "; ".join(s.planned_steps)
            )
        if s.rung == Rung.MONITOR.value:
            return await self._close(
                "monitored", f"{req.fault} is watched only; {req.node} stays in service"
            )

        try:
            await self._admitted("quarantine", contracts.guard_admit_quarantine, guard)
            await self._quarantine(req)
            await self._repair_until_healthy(req, guard)
            if self._k8s:
                await self._k8s_return()
            if s.spare_node is not None:
                # The spare took this node's place: it waits as the next spare instead.
                await self._park_as_spare(guard)
                await self._release(guard, back_in_service=True)
                return await self._close(
                    "resolved",
                    f"resolved; {s.spare_node} serves in place of {req.node}, which is the "
                    "new spare; " + self._timeline_text(),
                )
            back = await self._step(
                "return_to_service",
                lambda: workflow.execute_activity(
                    contracts.return_to_service,
                    ReturnInput(node=req.node, incident_id=req.incident_id),
                    start_to_close_timeout=self._slurm_timeout(),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=STEP_RETRY,
                ),
                detail=lambda r: r.state_after + (f" ({r.detail})" if r.detail else ""),
            )
            if not back.returned:
                raise ApplicationError(f"{req.node} not returned to service: {back.detail}")
        except Rejected as no:
            await self._release(guard, back_in_service=False)
            left = "left drained"
            if s.step("drain") or s.step("drain_held"):
                left = await self._left_drained()
            return await self._close("rejected", f"{no}; {req.node} {left}", "warning")
        except (ActivityError, ApplicationError, Unattended) as err:
            if self._cancelling(err):
                raise
            cause = cause_of(err)
            s.error = str(cause)
            await self._release(guard, back_in_service=False)
            drained = s.step("drain") or s.step("drain_held")
            left = "not drained"
            if drained and drained.outcome == "ok":
                left = await self._left_drained()
            await self._close(
                "failed",
                f"{cause}; {req.node} {left} under {req.incident_id}, needs a human",
                "critical",
            )
            raise ApplicationError(
                f"remediation of {req.node} failed: {cause}",
                type="RemediationFailed",
                non_retryable=True,
            ) from err

        await self._release(guard, back_in_service=True)
        return await self._close("resolved", "resolved; " + self._timeline_text())

    async def _quarantine(self, req: IncidentRequest) -> None:
        drain = await self._step(
            "drain",
            self._drain,
            detail=lambda r: (
                f"kept the drain already there: {r.previous_reason}"
                if r.previous_reason and r.already_drained
                else ""
            ),
        )
        self._note_drain(drain)
        if drain.already_drained and is_ops_reason(drain.previous_reason):
            raise Rejected(f"{req.node} is owned by {drain.previous_reason!r} (scale/teardown)")
        if drain.already_drained and is_sharing_reason(drain.previous_reason):
            # Lent to inference or moving: the rebalancer lets the node go once its move's
            # current step is done; the move stops there and the runbook goes on.
            await self._step(
                "take_from_rebalancer",
                lambda: workflow.execute_activity(
                    contracts.share_yield_node,
                    YieldCall(cluster=req.cluster, node=req.node, incident_id=req.incident_id),
                    start_to_close_timeout=timedelta(minutes=15),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=STEP_RETRY,
                ),
                detail=lambda r: (
                    f"was {r.pool_before}"
                    + (f"; waited for {r.waited_for_step}" if r.waited_for_step else "")
                    if r.held
                    else "no rebalancer held it"
                ),
            )
        requeued = await self._step(
            "requeue",
            lambda: workflow.execute_activity(
                contracts.requeue_jobs,
                RequeueInput(node=req.node, incident_id=req.incident_id),
                start_to_close_timeout=self._slurm_timeout(),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda r: r.describe(),
        )
        self._state.requeued_jobs = requeued.requeued
        if requeued.came_back:
            await self._returned_jobs(req, requeued)
        first = self._policy.step(Rung(self._state.rung or Rung.REBOOT.value))
        # Jobs that could not be requeued still run here: never repair under them, unless
        # the policy says force.
        self._state.waiting_for = Waiting(
            kind="idle", detail="jobs still on the node", since=workflow.now()
        )
        await self._step(
            "wait_idle",
            lambda: workflow.execute_activity(
                contracts.wait_node_idle,
                WaitIdleInput(
                    node=req.node,
                    timeout_s=first.idle_timeout_s if first.wait_for_idle else 0,
                    force=not first.wait_for_idle or first.on_idle_timeout == "force",
                    drain_reason=drain_reason(req.incident_id, req.fault),
                ),
                start_to_close_timeout=timedelta(seconds=first.idle_timeout_s + 120),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda r: (
                (f"cancelled {r.cancelled}" if r.cancelled else f"idle after {r.waited_s:.0f}s")
                + (f"; the drain was lost and applied again x{r.redrained}" if r.redrained else "")
            ),
        )
        self._state.waiting_for = None
        if self._k8s:
            await self._k8s_quarantine(first)

    async def _repair_until_healthy(self, req: IncidentRequest, guard: GuardContext) -> None:
        s, p = self._state, self._policy
        approved: Rung | None = None
        while True:
            rung = Rung(s.rung or Rung.REBOOT.value)
            if (p.mode == "approve" or p.step(rung).needs_approval) and approved != rung:
                # An approval is for one rung: a more severe fault that raises the rung
                # while we wait asks again, for the new rung.
                approved = await self._approval(rung)
                continue
            await self._admitted("repair", contracts.guard_admit_repair, guard)
            if rung == Rung.REPLACE and p.guard.spares and s.spare_node is None:
                s.spare_node = await self._spare_into_service(guard)
            if s.rung != rung.value:
                # Raised while the repair was held: give the slot back, repair the new rung.
                await self._release(guard, back_in_service=False, slot_only=True)
                continue
            await self._recheck_quarantine()  # after every wait: never repair under a job
            self._repairing = True
            s.repair_attempts += 1
            # One key per attempt: a retried activity resumes it, a new rung is a new repair.
            key = f"{req.incident_id}:{s.repair_attempts}:{rung.value}"
            repair_input = RepairInput(node=req.node, rung=rung, key=key)
            before = await self._k8s_identity() if self._k8s else None
            try:
                # The VM, into history.
                repair_input = await self._ride_out(
                    "plan_repair",
                    lambda inp=repair_input: with_recorded_vm(inp),  # type: ignore[misc]
                )
                done = await self._repair(repair_input, req.timeouts.repair_s)
            finally:
                await self._release(guard, back_in_service=False, slot_only=True)
            s.old_vm_id, s.new_vm_id = done.old_vm_id, done.new_vm_id
            if before is not None:
                await self._k8s_wait_new_machine(before, done)
            await self._wait_registered(req, done)
            report = await self._health_gate(done)  # Slurm's side and the agent's evidence
            s.health.append(report)
            if report.passed:
                return
            up = next_rung(rung)
            if up is None or s.repair_attempts >= p.max_repair_attempts:
                raise ApplicationError(
                    f"health gate failed after {rung.value} "
                    f"(attempt {s.repair_attempts}): {report.failures()}",
                    type="HealthGateFailed",
                    non_retryable=True,
                )
            s.rung = up.value
            self._publish()
            await self._notify(
                "escalated",
                f"health gate failed after {rung.value} ({report.failures()}); next: {up.value}",
                "warning",
            )

    async def _repair(self, inp: RepairInput, timeout_s: float) -> RepairResult:
        return await self._step(
            "repair",
            lambda: workflow.execute_activity(
                contracts.repair_node,
                inp,
                start_to_close_timeout=timedelta(seconds=timeout_s),
                # The activity beats every 2 s: a dead worker is noticed within 10 s and the
                # retry resumes the same keyed operation on another worker.
                heartbeat_timeout=timedelta(seconds=10),
                retry_policy=STEP_RETRY,
            ),
            detail=lambda r: f"{r.rung.value}: {r.old_vm_id} -> {r.new_vm_id}",
        )

    async def _wait_registered(self, req: IncidentRequest, done: RepairResult) -> None:
        if done.stopped_at is None:
            return  # a GPU reset: the machine never went away
        stopped_at = done.stopped_at
        await self._step(
            "wait_registered",
            lambda: workflow.execute_activity(
                contracts.wait_node_registered,
                WaitRegisteredInput(node=req.node, since=stopped_at),
                start_to_close_timeout=timedelta(seconds=req.timeouts.wait_registered_s),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=STEP_RETRY,
            ),
            detail=lambda n: n.display_state,
        )

    async def _approval(self, rung: Rung) -> Rung | None:
        """Wait for a human's decision on `rung`; remind once, then apply the policy.

        Returns the rung approved, or None when a more severe fault raised the incident's
        rung before anyone decided (the caller asks again, for the new rung).
        """
        s, p = self._state, self._policy
        s.waiting_for = Waiting(
            kind="approval", step=rung.value, detail=f"one of {p.approvers}", since=workflow.now()
        )
        self._decision = None
        self._publish()

        async def decided() -> ApprovalRecord | None:
            text = f"{rung.value} of {s.request.node} needs approval by one of {p.approvers}"
            await self._notify("approval_needed", text, "warning")
            timeout = timedelta(seconds=p.approval_timeout_s)
            for reminder in (True, False):
                try:
                    await workflow.wait_condition(
                        lambda: self._decision is not None or s.rung != rung.value,
                        timeout=timeout,
                    )
                    return self._decision
                except TimeoutError:
                    if reminder:
                        await self._notify("approval_reminder", "still waiting: " + text, "warning")
            if p.approval_timeout_action == "proceed":
                return self._decide(
                    ApprovalRequest(step=rung.value, approver="policy:timeout"), approved=True
                )
            raise Unattended(f"no decision on {rung.value} within {2 * p.approval_timeout_s:.0f}s")

        try:
            d = await self._step(
                "approval",
                decided,
                detail=lambda d: (
                    f"{'approved' if d.approved else 'rejected'} by {d.approver}"
                    if d
                    else f"none: a more severe fault raised the rung to {s.rung}"
                ),
            )
        finally:
            s.waiting_for = None
            self._publish()
        if d is None:
            return None
        if not d.approved:
            raise Rejected(
                f"{d.step} rejected by {d.approver}" + (f": {d.comment}" if d.comment else "")
            )
        return Rung(d.step)

    async def _returned_jobs(self, req: IncidentRequest, found: RequeueResult) -> None:
        """Jobs this incident requeued once are running on the node again (its drain was
        lost, e.g. an admin resumed it during a wait). Never a second requeue for one fault
        unless the policy says so: otherwise a human decides in Slack, cancel them or wait
        for them to end, within `returned_jobs_timeout_s` (not the idle timeout)."""
        s, p = self._state, self._policy
        jobs = found.came_back
        if p.returned_jobs == "requeue":
            again = await self._step(
                "requeue_again",
                lambda: workflow.execute_activity(
                    contracts.requeue_jobs,
                    RequeueInput(node=req.node, incident_id=req.incident_id, requeue_again=True),
                    start_to_close_timeout=self._slurm_timeout(),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=STEP_RETRY,
                ),
                detail=lambda r: r.describe(),
            )
            s.requeued_jobs = sorted({*s.requeued_jobs, *again.requeued})
            return
        s.waiting_for = Waiting(
            kind="approval",
            step=RETURNED_JOBS_STEP,
            detail=f"cancel jobs {jobs} or wait for them; one of {p.approvers}",
            since=workflow.now(),
        )
        self._decision = None
        self._publish()

        async def decided() -> ApprovalRecord:
            text = (
                f"{RETURNED_JOBS_STEP} of {req.node} needs approval by one of {p.approvers}: "
                f"jobs {jobs} were requeued once for {req.fault} and run on {req.node} again. "
                f"Approve: cancel them; reject: wait for them to end"
            )
            await self._notify("approval_needed", text, "warning")
            try:
                await workflow.wait_condition(
                    lambda: self._decision is not None,
                    timeout=timedelta(seconds=p.returned_jobs_timeout_s),
                )
            except TimeoutError:
                raise Unattended(
                    f"no decision on jobs {jobs} back on {req.node} within "
                    f"{p.returned_jobs_timeout_s:.0f}s"
                ) from None
            assert self._decision is not None
            return self._decision

        try:
            d = await self._step(
                RETURNED_JOBS_STEP,
                decided,
                detail=lambda d: (
                    f"cancel jobs {jobs}: approved by {d.approver}"
                    if d.approved
                    else f"wait for jobs {jobs}: {d.approver}"
                ),
            )
        finally:
            s.waiting_for = None
            self._publish()
        if d.approved:
            await self._step(
                "cancel_jobs",
                lambda: workflow.execute_activity(
                    contracts.cancel_jobs,
                    CancelJobsInput(node=req.node, job_ids=jobs),
                    start_to_close_timeout=self._slurm_timeout(),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=STEP_RETRY,
                ),
                detail=lambda r: (
                    f"cancelled {r.cancelled or 'none'}"
                    + (f"; already gone {r.gone}" if r.gone else "")
                ),
            )

    async def _left_drained(self) -> str:
        """What the closing words may say about the node, read back from Slurm: a drain
        the controller lost is applied again first. Never assumed."""
        try:
            found = await self._step(
                "verify_drained",
                lambda: self._drained_again_if_lost(),
                detail=lambda f: f.describe(),
            )
        except (ActivityError, ApplicationError) as err:
            return f"drain state unknown ({cause_of(err)})"
        if found.drained and found.ours:
            return "left drained"
        if found.drained:
            return f"left drained by someone else ({found.reason!r})"
        return f"NOT drained ({found.state}) although the incident drained it"

    async def _drained_again_if_lost(self) -> QuarantineStatus:
        found = (await self._quarantine_now()).slurm
        if found.drained or not found.restorable:
            return found
        await self._step(
            "redrain",
            self._drain,
            detail=lambda _: f"the drain was lost ({found.state}); applied again",
        )
        return (await self._quarantine_now()).slurm

    async def _drain(self) -> DrainResult:
        """Drain the node under this incident's reason (the activity reads it back)."""
        r = self._state.request
        return await workflow.execute_activity(
            contracts.drain_node,
            DrainInput(node=r.node, reason=drain_reason(r.incident_id, r.fault)),
            start_to_close_timeout=self._slurm_timeout(),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=STEP_RETRY,
        )

    def _outage_budget(self) -> tuple[float, float]:
        return self._policy.outage_budget_s, self._policy.outage_notify_after_s

    async def _release(
        self, guard: GuardContext, back_in_service: bool, *, slot_only: bool = False
    ) -> None:
        self._repairing = False
        await self._give_back(guard, back_in_service, slot_only=slot_only)

    async def _close(
        self, status: IncidentStatus, text: str, severity: str = "info"
    ) -> IncidentState:
        s = self._state
        s.status, s.closed_at, s.current_step, s.waiting_for = status, workflow.now(), None, None
        self._publish()
        await self._notify(status, text, severity)
        return s

    # --- helpers ------------------------------------------------------------------------

    def _worst_rung(self) -> Rung:
        rungs = [self._policy.rung_for(f.fault, self._recent) for f in self._state.faults]
        return max(rungs, key=LADDER.index)

    def _severity(self) -> str:
        order = {"info": 0, "warning": 1, "critical": 2}
        return max(
            (self._policy.rule_for(f.fault).severity for f in self._state.faults),
            key=order.__getitem__,
        )

    def _slurm_timeout(self) -> timedelta:
        return timedelta(seconds=self._state.request.timeouts.slurm_step_s)

    def _opening_text(self, reg: Registration) -> str:
        s, r = self._state, self._state.request
        text = f"{r.fault} on {r.node}: plan {s.rung} (mode {s.mode})"
        if self._recent:
            text += f"; {self._recent} earlier incident(s) on this node within the window"
        if reg.breaker.tripped:
            b = reg.breaker
            where = (
                f"; all behind leaf {b.shared_leaf}"
                if b.shared_leaf
                else (f"; all in pod {b.shared_pod}" if b.shared_pod else "")
            )
            text += (
                f"; CIRCUIT BREAKER TRIPPED by {', '.join(b.nodes)}{where}: "
                "repairs wait for a human reset"
            )
        if headline := self._headline():  # the alert's summary and runbook link
            text += f"\n{headline}"
        return text

    def _plan(self) -> list[str]:
        s, p, r = self._state, self._policy, self._state.request
        rung = Rung(s.rung or Rung.REBOOT.value)
        if rung == Rung.MONITOR:
            return [f"watch {r.node}; no drain"]
        step = p.step(rung)
        plan = [
            f"drain {r.node} with reason '{drain_reason(r.incident_id, r.fault)}' "
            "(when the fleet guard admits)",
            "requeue the node's requeueable jobs and release their requeue hold",
            f"wait until {r.node} is idle "
            f"(up to {step.idle_timeout_s:.0f}s, then {step.on_idle_timeout})"
            if step.wait_for_idle
            else f"cancel what still runs on {r.node} (force)",
        ]
        if p.mode == "approve" or step.needs_approval:
            plan.append(f"wait for approval of {rung.value} by one of {p.approvers}")
        plan += [
            f"{rung.value} {r.node} (when the fleet guard admits)",
            "wait until the node registers in Slurm again",
            "health gate; on failure one rung up the ladder",
            "return to service",
        ]
        return plan

    def _show_current(self, step: str) -> None:
        s = self._state
        workflow.set_current_details(
            f"**{s.request.node}** {s.request.fault}: step **{step}**, "
            f"rung {s.rung or '-'}, status {s.status}"
            + (f"\n\n{headline}" if (headline := self._headline()) else "")
        )

    def _publish(self) -> None:
        """Search attributes and UI details follow the incident's state."""
        s = self._state
        workflow.upsert_search_attributes(
            [
                temporal.INCIDENT_STATUS.value_set(
                    "waiting_approval"
                    if s.waiting_for and s.waiting_for.kind == "approval"
                    else s.status
                ),
                temporal.REPAIR_ACTION.value_set(s.rung or "none"),
            ]
        )
        self._show_current(s.current_step or "-")
