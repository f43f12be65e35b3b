"""NodeRemediation: the runbook for one faulty node, one incident per node.

register with the fleet guard (recurrence, breaker) → notify → [observe: plan, stop]
[monitor-only fault: stop] → quarantine when admitted (drain) → requeue the node's jobs so
they restart at once elsewhere → wait until the node is idle (or force) → [a fault that is
often software (a hung job, a straggler): screen the node; passed: return it unrepaired] →
per rung of the ladder reset_gpu → reboot → replace: [approval] → repair when admitted →
wait until it registers → health gate (and screen), one rung up on failure → return to
service → close.

With the policy's `handoff` (docs/handoff.md), where automation has done all it can (the
ladder ended with a failed gate, a lemon, a fault that is the provider's, handed off right
after the drain): hand off to the provider → wait for the answer: fixed → gate and return;
replaced → bring-up, gate and return; declined → left drained, closed `handed_off`.

Never return a node that failed its health gate: a failed incident leaves the node drained
under a reason naming the incident and pages a human.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.evidence import EvidenceAck, HealthSnapshot
    from autoclusters.core.fault_evidence import FaultCleared
    from autoclusters.core.guard import (
        AdmittedNotice,
        GuardContext,
        IncidentOpened,
        RegisterCall,
        Registration,
    )
    from autoclusters.core.handoff import incident_bundle
    from autoclusters.core.handoff_answer import HandoffAnswer, HandoffReason, HandoffRecord
    from autoclusters.core.ladder import climb, skip_from
    from autoclusters.core.lemon import is_lemon, lemon_text
    from autoclusters.core.models import (
        ApprovalRecord,
        ApprovalRequest,
        FaultAck,
        FaultReport,
        FaultSeen,
        IncidentRequest,
        IncidentState,
        IncidentStatus,
        LiftSilenceInput,
        RefusedApproval,
        RepairInput,
        RepairResult,
        ReturnInput,
        StepRecord,
        Waiting,
        WaitRegisteredInput,
        drain_reason,
    )
    from autoclusters.core.policy import LADDER, Policy, Rung
    from autoclusters.core.systemic_member import Membership, SystemicVerdict

from autoclusters.workflows.approvals import Approvals
from autoclusters.workflows.burn_in_steps import BurnIn
from autoclusters.workflows.controller_restart import ControllerRestart
from autoclusters.workflows.fault_intake import FaultIntake
from autoclusters.workflows.guard_steps import GuardSeat
from autoclusters.workflows.handoff_steps import Declined, ProviderHandoff
from autoclusters.workflows.health_gate_steps import Evidence, health_gate
from autoclusters.workflows.incident import Incident, Rejected, Unattended
from autoclusters.workflows.kubernetes_steps import KubernetesNode
from autoclusters.workflows.quarantine_check import Quarantine
from autoclusters.workflows.recorded_vm import with_recorded_vm
from autoclusters.workflows.recovery_loss_steps import measure_losses
from autoclusters.workflows.spare_steps import Spares
from autoclusters.workflows.steps import cause_of
from autoclusters.workflows.systemic_member import SystemicSeat, YieldToSystemic

# The repair activity beats every 2 s: a dead worker is noticed within 10 s and the retry
# resumes the same keyed operation on another worker.
REPAIR_HEARTBEAT = timedelta(seconds=10)


@workflow.defn
class NodeRemediation:
    @workflow.init
    def __init__(self, req: IncidentRequest) -> None:
        # Built from the input so queries and updates see the incident from the first moment.
        state = IncidentState(
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
        self._state = state
        self._policy = p = req.policy or Policy()
        self._inc = inc = Incident(state, p)
        self._repairing = False
        self._started = False  # the runbook began: the guard may hold something of ours
        self._intake = FaultIntake(state)
        if req.opening is not None:  # started by the API's storm path: no update brought it
            self._intake.merge(req.opening)
        self._evidence = Evidence(state)
        self._approvals = Approvals(inc)
        self._k8s = KubernetesNode(inc) if req.kubernetes else None
        self._quarantine = Quarantine(inc, self._approvals, self._k8s)
        self._controller = ControllerRestart(inc, self._quarantine)
        guard = GuardContext(
            cluster=req.cluster, policy=p.guard, topology=p.topology, approvers=p.approvers
        )
        self._guard = GuardSeat(inc, guard)
        self._spares = Spares(inc, guard)
        self._burn_in = BurnIn(inc, self._k8s)
        self._handoff = ProviderHandoff(p.handoff, inc.steps, inc.notify, self._show_handoff)
        # Policy guard.systemic: a member of a systemic incident yields to it
        # (workflows/systemic_member.py, docs/systemic.md).
        self._systemic = SystemicSeat(inc, self._guard, self._evidence, self._burn_in)
        self._handoff.interrupt = self._systemic.pending

    # --- what people and other systems see and send -------------------------------------

    @workflow.query
    def status(self) -> IncidentState:
        return self._state

    @workflow.update
    def health_evidence(self, snap: HealthSnapshot) -> EvidenceAck:
        """A health snapshot from the node's agent (the API forwards them): kept for the
        health gate, which waits for a fresh healthy one after each repair."""
        return self._evidence.take(snap)

    @workflow.query
    def wants_evidence(self, snap: HealthSnapshot) -> bool:
        """Would `health_evidence` keep this snapshot? The API asks first: a query leaves
        no trace in the history, so the repeats of an incident held for days cost nothing."""
        return self._state.status == "open" and self._evidence.is_news(snap)

    @health_evidence.validator
    def _check_evidence(self, snap: HealthSnapshot) -> None:
        # A refused update leaves no event: repeats of what is known cost nothing.
        if self._state.status != "open":
            raise ValueError(f"incident {self._state.request.incident_id} is closed")
        if not self._evidence.is_news(snap):
            raise ValueError("nothing new: the same as the last snapshot kept")

    @workflow.update
    def report_fault(self, rep: FaultReport) -> FaultAck:
        """An alert for this node: merged into the open incident (no second drain)."""
        return self._report(rep)

    def _report(self, rep: FaultReport) -> FaultAck:
        s = self._state
        ack, _ = self._intake.merge(rep)
        # A more severe fault raises the rung of an incident that is not repairing yet.
        if not ack.repeat and s.rung is not None and not self._repairing:
            p = self._policy
            choice = skip_from(p, rep.fault, p.rung_for(rep.fault, self._inc.recent), p.ladder)
            worse = choice.rung
            if LADDER.index(worse) > LADDER.index(Rung(s.rung)):
                self._note_skipped(choice.skipped)
                s.rung = worse.value
                self._inc.publish()
                ack = ack.model_copy(update={"rung": s.rung})
        return ack

    @workflow.update
    def fault_cleared(self, cleared: FaultCleared) -> bool:
        """A source says a fault stopped holding: recorded, never a reason to stop a repair."""
        return self._intake.clear(cleared)

    @fault_cleared.validator
    def _check_fault_cleared(self, cleared: FaultCleared) -> None:
        self._intake.check_cleared(cleared)

    @report_fault.validator
    def _check_report(self, rep: FaultReport) -> None:
        if self._state.status != "open":
            raise ValueError(f"incident {self._state.request.incident_id} is closed")

    @workflow.update
    def report_faults(self, reps: list[FaultReport]) -> list[FaultAck]:
        """Alerts of several fault kinds at once (the API's batch of a node's alerts in a
        storm): each taken as `report_fault` takes it, in one update instead of one each."""
        return [self._report(rep) for rep in reps]

    @report_faults.validator
    def _check_reports(self, reps: list[FaultReport]) -> None:
        if self._state.status != "open":
            raise ValueError(f"incident {self._state.request.incident_id} is closed")

    @workflow.update
    async def approve(self, req: ApprovalRequest) -> ApprovalRecord:
        return await self._approvals.proven(req, approved=True)

    @approve.validator
    def _check_approve(self, req: ApprovalRequest) -> None:
        self._approvals.check(req)

    @workflow.update
    async def reject(self, req: ApprovalRequest) -> ApprovalRecord:
        return await self._approvals.proven(req, approved=False)

    @reject.validator
    def _check_reject(self, req: ApprovalRequest) -> None:
        self._approvals.check(req)

    @workflow.signal
    def approval_refused(self, refused: RefusedApproval) -> None:
        """A refused approve/reject, sent by the client so the attempt is in the history
        (a validator's refusal itself leaves no trace)."""
        self._state.refusals.append(refused)

    @workflow.signal
    def guard_admitted(self, notice: AdmittedNotice) -> None:
        """The fleet guard admitted this incident from its queue (the ticket it was given)."""
        if notice.incident_id == self._state.request.incident_id:
            self._guard.tickets.add(notice.ticket)

    @workflow.signal
    def systemic_member(self, membership: Membership) -> None:
        """The fleet guard: this node's fault is part of a systemic incident."""
        self._systemic.told(membership)

    @workflow.signal
    def systemic_verdict(self, verdict: SystemicVerdict) -> None:
        """The systemic incident: what becomes of this node now that it is over."""
        self._systemic.verdict(verdict)

    @workflow.update
    def handoff_answer(self, answer: HandoffAnswer) -> HandoffRecord:
        """The provider's answer to the hand-off (the API verified its signature):
        fixed, replaced or declined (docs/handoff.md)."""
        return self._handoff.take(answer)

    @handoff_answer.validator
    def _check_handoff_answer(self, answer: HandoffAnswer) -> None:
        if self._state.status != "open":
            raise ValueError(f"incident {self._state.request.incident_id} is closed")
        self._handoff.check(answer)

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
        inc, s, p = self._inc, self._state, self._policy
        s.mode = p.mode
        self._started = True
        reg = await inc.steps.activity(
            "guard_register",
            contracts.guard_register,
            RegisterCall(
                guard=self._guard.guard,
                incident=IncidentOpened(
                    node=req.node,
                    incident_id=req.incident_id,
                    fault=req.fault,
                    recurrence_window_s=p.recurrence_window_s,
                    # To be told it belongs to a systemic incident (policy guard.systemic).
                    workflow_id=workflow.info().workflow_id if self._systemic.on else None,
                ),
            ),
            f"open incident {req.incident_id} on {req.node} ({req.fault}) with the fleet guard",
            lambda r: (
                f"{r.recent_on_node} recent on node; "
                f"breaker {'TRIPPED' if r.breaker.tripped else 'ok'}"
            ),
        )
        inc.recent = reg.recent_on_node
        self._systemic.registered_at = workflow.now()
        s.rung = inc.worst_rung().value
        self._note_skipped(inc.skipped)
        inc.publish()
        await inc.notify("opened", self._opening_text(reg), inc.severity())

        if p.mode == "observe":
            s.planned_steps = self._plan()
            return await self._close(
                "observed", "observe mode, nothing changed; would: " + "; ".join(s.planned_steps)
            )
        if s.rung == Rung.MONITOR.value:
            return await self._close(
                "monitored", f"{req.fault} is watched only; {req.node} stays in service"
            )
        if reg.systemic is not None:
            # The fault makes (or joins) a systemic incident: join it now, so that it
            # starts even while this node waits for the floor.
            self._systemic.told(reg.systemic)
            await self._systemic.join()

        try:
            await self._guard.admitted("quarantine", contracts.guard_admit_quarantine)
            await self._quarantine.take()
            if await self._systemic.owns_it(req):
                pass  # screened with the other members and passed: returned below
            elif p.handoff.hands_off(req.fault):  # only the provider can fix it (policy)
                await self._systemic.unless_yielding(
                    lambda: self._provider_repair(
                        req, "provider_fault", f"{req.fault} is the provider's to fix (policy)"
                    ),
                    req,
                    self._repair_or_hand_off,
                )
            elif not await self._screened_back(req):
                await self._systemic.unless_yielding(
                    lambda: self._repair_or_hand_off(req), req, self._repair_or_hand_off
                )
            if is_lemon(p, req.prior_repairs):
                # Repaired again and again: held drained (and cordoned) until a person says,
                # or the provider has looked at the machine (policy handoff.when: lemon).
                s.lemon = True
                if self._handoff.may("lemon"):
                    # The lemon text's first clause: the rest asks the approvers.
                    why = lemon_text(p, req.node, req.prior_repairs or 0).split(";")[0]
                    await self._provider_repair(req, "lemon", why)
                else:
                    await self._approvals.release_lemon(
                        lemon_text(p, req.node, req.prior_repairs or 0)
                    )
            # The controller may have restarted meanwhile: never return a node with a job
            # Slurm places on it that cannot be running.
            await self._controller.recheck()
            if self._k8s is not None:
                await self._k8s.give_back()
            if s.spare_node is not None:
                # The spare took this node's place: it waits as the next spare instead.
                await self._spares.park()
                await self._release(back_in_service=True)
                return await self._close(
                    "resolved",
                    f"resolved; {s.spare_node} serves in place of {req.node}, which is the "
                    "new spare; " + inc.timeline_text(),
                )
            back = await inc.steps.activity(
                "return_to_service",
                contracts.return_to_service,
                ReturnInput(
                    node=req.node, incident_id=req.incident_id, standby_holders=p.standby_holders
                ),
                f"return {req.node} to service",
                lambda r: r.state_after + (f" ({r.detail})" if r.detail else ""),
            )
            if not back.returned:
                raise ApplicationError(f"{req.node} not returned to service: {back.detail}")
        except Declined as no:
            await self._release(back_in_service=False)
            left = await self._quarantine.left_drained()
            return await self._close("handed_off", f"{no}; {req.node} {left}", "warning")
        except Rejected as no:
            await self._release(back_in_service=False)
            left = "left drained"
            if s.step("drain") or s.step("drain_held"):
                left = await self._quarantine.left_drained()
            return await self._close("rejected", f"{no}; {req.node} {left}", "warning")
        except (ActivityError, ApplicationError, Unattended) as err:
            if self._cancelling(err):
                raise
            cause = cause_of(err)
            s.error = str(cause)
            await self._release(back_in_service=False)
            drained = s.step("drain") or s.step("drain_held")
            left = "not drained"
            if drained and drained.outcome == "ok":
                left = await self._quarantine.left_drained()
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

        await self._release(back_in_service=True)
        how = "resolved" if s.repair_attempts else "resolved without a repair (passed its screen)"
        if not s.repair_attempts and (v := s.systemic_verdict) is not None:
            how = f"resolved without a repair (systemic incident {v.incident_id}: {v.verdict})"
        return await self._close("resolved", f"{how}; " + inc.timeline_text())

    async def _screened_back(self, req: IncidentRequest) -> bool:
        """A fault that is often software (a hung job, a straggler; its rule says
        `screen_before_repair`): its jobs recovered, the node is screened before any repair.
        True: it passed, and goes back unrepaired (the incident still counts in its lemon
        record). Only a rule with the flag takes this path, so a run opened under a policy
        without it issues what it always did (docs/versioning.md)."""
        if not self._screen_decides():
            return False
        await self._quarantine.recheck()  # never screen under a job
        passed = await self._burn_in.before_repair()
        if passed and not self._screen_decides():
            # A fault no screen clears (an Xid, a lost link) came in during the screen.
            seen = ", ".join(f.fault for f in self._state.faults)
            await self._inc.notify(
                "escalated",
                f"{req.node} passed its screen, but the incident now has {seen}: repaired, "
                f"not returned; next: {self._state.rung}",
                "warning",
            )
            return False
        return passed

    def _screen_decides(self) -> bool:
        """Only when every fault of the incident says `screen_before_repair` can a screen
        send the node back: a hung job beside an Xid is the Xid's to repair."""
        p = self._policy
        return all(p.rule_for(f.fault).screen_before_repair for f in self._state.faults)

    async def _repair_until_healthy(self, req: IncidentRequest) -> None:
        inc, s, p = self._inc, self._state, self._policy
        approved: Rung | None = None
        while True:
            rung = Rung(s.rung or Rung.REBOOT.value)
            if (p.mode == "approve" or p.step(rung).needs_approval) and approved != rung:
                # An approval is for one rung: a more severe fault that raises the rung
                # while we wait asks again, for the new rung.
                approved = await self._approvals.repair(rung)
                continue
            adm = await self._guard.admitted("repair", contracts.guard_admit_repair)
            if adm.systemic is not None:  # the fabric's fault: no repair of ours for now
                raise YieldToSystemic(adm.systemic)
            if rung == Rung.REPLACE and p.guard.spares and s.spare_node is None:
                s.spare_node = await self._spares.into_service()
            if s.rung != rung.value:
                # Raised while the repair was held: give the slot back, repair the new rung.
                await self._release(back_in_service=False, slot_only=True)
                continue
            await self._quarantine.recheck()  # after every wait: never repair under a job
            if self._systemic.pending():
                # Told it is a member since its admission: the repair never starts.
                await self._release(back_in_service=False, slot_only=True)
                raise YieldToSystemic(None)
            self._repairing = True
            s.repair_attempts += 1
            # One key per attempt: a retried activity resumes it, a new rung is a new repair.
            key = f"{req.incident_id}:{s.repair_attempts}:{rung.value}"
            repair_input = RepairInput(node=req.node, rung=rung, key=key)
            before = await self._k8s.identity() if self._k8s is not None else None
            try:
                # The VM, into history.
                repair_input = await inc.steps.ride_out(
                    "plan_repair",
                    lambda inp=repair_input: with_recorded_vm(inc.steps, inp),  # type: ignore[misc]
                )
                done = await self._repair(repair_input, req.timeouts.repair_s)
            finally:
                await self._release(back_in_service=False, slot_only=True)
            s.old_vm_id, s.new_vm_id = done.old_vm_id, done.new_vm_id
            if self._systemic.pending():
                # Told it is a member while this repair ran (it was not stopped midway):
                # no gate and no next rung of its own; it yields with the repair done.
                raise YieldToSystemic(None, repaired=rung.value)
            if before is not None and self._k8s is not None:
                await self._k8s.wait_new_machine(before, done)
            await self._wait_registered(req, done)
            await self._controller.recheck()  # a controller that forgot: before the gate
            report = await health_gate(inc, self._evidence, done)  # Slurm's and the agent's
            if report.passed and self._burn_in.after_repair():
                report = await self._burn_in.gate_check(report)  # failed screen: failed gate
            s.health.append(report)
            if report.passed:
                return
            # One rung up, past any the ladder's figures rule out for this fault.
            climbed = climb(p, req.fault, rung)
            up = climbed.rung if climbed is not None else None
            if up is None or s.repair_attempts >= p.max_repair_attempts:
                raise ApplicationError(
                    f"health gate failed after {rung.value} "
                    f"(attempt {s.repair_attempts}): {report.failures()}",
                    type="HealthGateFailed",
                    non_retryable=True,
                )
            s.rung = up.value
            skipped = climbed.skipped if climbed is not None else []
            self._note_skipped(skipped)
            inc.publish()
            await inc.notify(
                "escalated",
                f"health gate failed after {rung.value} ({report.failures()}); next: {up.value}"
                + "".join(f"; {why}" for why in skipped),
                "warning",
            )

    # --- the hand-off to the provider (workflows/handoff_steps.py, docs/handoff.md) --------

    async def _repair_or_hand_off(self, req: IncidentRequest) -> None:
        """The ladder; where it ends with a failed gate and the policy says so, the
        provider's repair. Without policy.handoff no command changes (docs/versioning.md)."""
        try:
            await self._repair_until_healthy(req)
        except ApplicationError as err:
            if err.type != "HealthGateFailed" or not self._handoff.may("health_gate_failed"):
                raise
            await self._provider_repair(req, "health_gate_failed", err.message)

    async def _provider_repair(self, req: IncidentRequest, why: HandoffReason, text: str) -> None:
        """Hand the node off and wait for the answer: fixed, the health gate (and burn-in)
        on the machine as it is; replaced, the bring-up of a new machine, as after our own
        replacement; declined, `Declined`. A gate failed after the answer fails the
        incident: one hand-off per incident, a human takes it from there."""
        inc, s = self._inc, self._state
        before = await self._k8s.identity() if self._k8s is not None else None
        bundle = incident_bundle(s, self._evidence.snapshots, why, text, workflow.now())
        rec = await self._handoff.hand_off(bundle, req.node)
        if rec.answer is None:  # told it is a member of a systemic incident meanwhile
            self._handoff.given_up = "the node is a member of a systemic incident"
            raise YieldToSystemic(None)
        if rec.answer == "declined":
            raise Declined(
                "the provider declined the hand-off"
                + (f" (ticket {rec.ticket})" if rec.ticket else "")
                + (f": {rec.note}" if rec.note else "")
            )
        s.repair_attempts += 1  # the provider's repair: the screen's key is a new one
        done = RepairResult(
            node=req.node,
            rung=Rung.REPLACE if rec.answer == "replaced" else Rung(s.rung or Rung.REBOOT.value),
            old_vm_id=s.new_vm_id or s.old_vm_id or "",
            new_vm_id=rec.new_vm_id or "",
            # Replaced: the new machine's slurmd and agent report from after the provider
            # took the hand-off (the worker's clock, as the machines'). Fixed: the machine
            # may not have restarted; the gate takes evidence from after its own check.
            stopped_at=rec.accepted_at if rec.answer == "replaced" else None,
        )
        if rec.answer == "replaced":
            s.old_vm_id, s.new_vm_id = done.old_vm_id or None, done.new_vm_id or None
            if before is not None and self._k8s is not None:
                await self._k8s.wait_new_machine(before, done)
            await self._wait_registered(req, done)
        await self._controller.recheck()
        report = await health_gate(inc, self._evidence, done)
        if report.passed and self._burn_in.after_repair():
            report = await self._burn_in.gate_check(report)  # failed screen: failed gate
        s.health.append(report)
        if not report.passed:
            raise ApplicationError(
                f"health gate failed after the provider's answer {rec.answer}: {report.failures()}",
                type="HealthGateFailed",
                non_retryable=True,
            )

    def _show_handoff(self, rec: HandoffRecord, waiting: Waiting | None) -> None:
        self._state.handoff, self._state.waiting_for = rec, waiting
        self._inc.publish()

    async def _repair(self, inp: RepairInput, timeout_s: float) -> RepairResult:
        what = {Rung.RESET_GPU: "reset the GPUs of", Rung.REBOOT: "reboot"}.get(
            inp.rung, f"{inp.rung.value}"
        )
        vm = f"VM {inp.vm_id[:8]}… of " if inp.vm_id and inp.rung == Rung.REPLACE else ""
        return await self._inc.steps.activity(
            "repair",
            contracts.repair_node,
            inp,
            f"{what} {vm}{inp.node} ({self._state.request.fault})",
            lambda r: f"{r.rung.value}: {r.old_vm_id} -> {r.new_vm_id}",
            timeout=timedelta(seconds=timeout_s),
            heartbeat=REPAIR_HEARTBEAT,
        )

    async def _wait_registered(self, req: IncidentRequest, done: RepairResult) -> None:
        if done.stopped_at is None:
            return  # a GPU reset: the machine never went away
        await self._inc.steps.activity(
            "wait_registered",
            contracts.wait_node_registered,
            WaitRegisteredInput(
                node=req.node,
                since=done.stopped_at,
                incident_id=req.incident_id,
                drain_reason=drain_reason(req.incident_id, req.fault),
            ),
            f"wait for {req.node} to register with slurmctld again",
            lambda n: n.display_state,
            timeout=timedelta(seconds=req.timeouts.wait_registered_s),
        )

    async def _release(self, back_in_service: bool, *, slot_only: bool = False) -> None:
        self._repairing = False
        await self._guard.give_back(back_in_service, slot_only=slot_only)

    def _note_skipped(self, skipped: list[str]) -> None:
        """A rung the ladder's figures ruled out, on the timeline with why (state only: no
        command, so histories from before `skip_rung_below` replay unchanged)."""
        now = workflow.now()
        for why in skipped:
            self._state.steps.append(
                StepRecord(
                    name="skip_rung", started_at=now, finished_at=now, outcome="ok", detail=why
                )
            )

    def _cancelling(self, err: BaseException) -> bool:
        """Is `err` this incident's cancellation (closed `cancelled`)?"""
        return self._state.status == "open" and is_cancelled_exception(err)

    async def _close_cancelled(self) -> None:
        """Cancelled (e.g. from the Temporal UI): give back the guard's slot or queue place,
        leave the node as it is (drained by us: for a human), close `cancelled`."""
        s, r = self._state, self._state.request
        drained = any(
            st.outcome == "ok" and st.name in ("drain", "drain_held", "requarantine")
            for st in s.steps
        )
        s.waiting_for = None
        if self._started:
            await self._guard.give_back(back_in_service=not drained)
        where = (
            f"{r.node} left drained under {r.incident_id} for a human"
            if drained
            else f"{r.node} was not drained"
        )
        await self._close("cancelled", f"cancelled; {where}", "warning")

    async def _close(
        self, status: IncidentStatus, text: str, severity: str = "info"
    ) -> IncidentState:
        s = self._state
        # Before the silence is lifted (the jobs' own restarts are what is read); a cancel
        # closes at once.
        measured = await measure_losses(self._inc) if status != "cancelled" else ""
        if s.silence_id is not None:
            lifted = await self._inc.steps.activity(
                "lift_silence",
                contracts.lift_silence,
                LiftSilenceInput(silence_id=s.silence_id, incident_id=s.request.incident_id),
                f"lift the Alertmanager silence of {s.request.node}",
                lambda r: r,
            )
            text += f"; {lifted}"
        text += measured
        s.status, s.closed_at, s.current_step, s.waiting_for = status, workflow.now(), None, None
        self._inc.publish()
        await self._inc.notify(status, text, severity)
        return s

    # --- what the incident says -------------------------------------------------------------

    def _opening_text(self, reg: Registration) -> str:
        inc, s, r = self._inc, self._state, self._state.request
        text = f"{r.fault} on {r.node}: plan {s.rung} (mode {s.mode})"
        if inc.recent:
            text += f"; {inc.recent} earlier incident(s) on this node within the window"
        text += "".join(f"; {why}" for why in inc.skipped)
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
        if headline := inc.headline():  # the alert's summary and runbook link
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
            *(
                [
                    f"ask the node's jobs to checkpoint and requeue themselves "
                    f"(signal {p.checkpoint_signal}, up to {p.checkpoint_budget_s:.0f}s)"
                ]
                if p.rule_for(r.fault).on_degraded == "checkpoint_then_drain"
                else []
            ),
            "requeue the node's requeueable jobs and release their requeue hold"
            + (
                " (a job holding a hot spare goes on without the node instead)"
                if p.job_recovery == "in-job"
                else ""
            ),
            f"wait until {r.node} is idle "
            f"(up to {step.idle_timeout_s:.0f}s, then {step.on_idle_timeout})"
            if step.wait_for_idle
            else f"cancel what still runs on {r.node} (force)",
        ]
        h = p.handoff
        if h.hands_off(r.fault):  # the provider's: no repair of ours (docs/handoff.md)
            return [
                *plan,
                f"hand {r.node} off to the provider ({h.url}); wait, drained, for the answer: "
                "fixed, the health gate and return; replaced, the bring-up and return; "
                "declined, left drained",
            ]
        if p.rule_for(r.fault).screen_before_repair:
            plan.append(
                f"burn-in screen of {r.node} before any repair: passed, return it unrepaired "
                "(counted in its lemon record); failed, the ladder below, each repair screened"
            )
        if p.mode == "approve" or step.needs_approval:
            plan.append(f"wait for approval of {rung.value} by one of {p.approvers}")
        plan += [
            f"{rung.value} {r.node} (when the fleet guard admits)",
            "wait until the node registers in Slurm again",
            "health gate; on failure one rung up the ladder",
            *(
                [
                    "burn-in screen in a breakfix reservation (all-reduce with a healthy idle "
                    "neighbour, the agent's active diagnostic); on failure one rung up"
                ]
                if p.burn_in.enabled
                else []
            ),
            "return to service",
        ]
        if h.enabled and "health_gate_failed" in h.when:
            plan.insert(
                -1, f"where the ladder ends with a failed gate: hand off to the provider ({h.url})"
            )
        return plan
