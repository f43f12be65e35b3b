"""A human's decisions in an incident: approve or reject a repair, and what to do about jobs
that came back to the node after their requeue. Decisions arrive through the workflow's
`approve` and `reject` updates (validated by `check`), each with the API's proof of who
made it, which the worker checks (`proven`) before the decision counts; a step waits for
one, reminds once, then applies the policy.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.lemon import LEMON_STEP
    from autoclusters.core.models import (
        RETURNED_JOBS_STEP,
        ApprovalRecord,
        ApprovalRequest,
        ProofCheck,
        RefusedApproval,
        Waiting,
    )
    from autoclusters.core.policy import Rung

from autoclusters.workflows.incident import Incident, Rejected, Unattended

PROOF_PATCH = "remediation-0.2-decision-proof"


class Approvals:
    def __init__(self, incident: Incident) -> None:
        self.incident = incident
        self.decision: ApprovalRecord | None = None

    # --- decisions in (the workflow's updates) ----------------------------------------------

    def check(self, req: ApprovalRequest) -> None:
        s, p = self.incident.state, self.incident.policy
        waiting = s.waiting_for
        if waiting is None or waiting.kind != "approval" or self.decision is not None:
            raise ValueError(f"incident {s.request.incident_id} is not waiting for a decision")
        if req.step != waiting.step:
            raise ValueError(f"the decision waited for is on {waiting.step}, not {req.step}")
        if req.approver not in p.approvers:
            raise ValueError(f"{req.approver} is not an approver for cluster {s.request.cluster}")
        if not req.proof:
            raise ValueError("no proof of who decides: decide through the API or Slack")

    async def proven(self, req: ApprovalRequest, approved: bool) -> ApprovalRecord:
        """`decide`, once the worker has checked the proof that `req.approver` made this
        decision (activities/decisions.py). A proof that does not hold is recorded as a
        refusal and fails the update; so does a decision the incident stopped waiting for
        while the proof was checked."""
        # Runs started before proofs took no decision without one; their replays must
        # issue no check (docs/versioning.md).
        if not workflow.patched(PROOF_PATCH):
            return self.decide(req, approved)
        s = self.incident.state
        verdict = await workflow.execute_local_activity(
            contracts.check_decision_proof,
            ProofCheck(
                proof=req.proof,
                subject=s.request.incident_id,
                step=req.step,
                approver=req.approver,
                approve=approved,
            ),
            start_to_close_timeout=timedelta(seconds=10),
        )
        try:
            if not verdict.ok:
                raise ValueError(verdict.reason)
            self.check(req)  # again: the incident may have moved on meanwhile
        except ValueError as e:
            s.refusals.append(
                RefusedApproval(
                    step=req.step, approver=req.approver, approved=approved, reason=str(e),
                    at=workflow.now(),
                )
            )  # fmt: skip
            self.incident.publish()
            raise ApplicationError(str(e), type="DecisionRefused", non_retryable=True) from None
        return self.decide(req, approved)

    def decide(self, req: ApprovalRequest, approved: bool) -> ApprovalRecord:
        self.decision = ApprovalRecord(
            step=req.step,
            approver=req.approver,
            approved=approved,
            comment=req.comment,
            at=workflow.now(),
        )
        self.incident.state.approvals.append(self.decision)
        return self.decision

    # --- waiting for one ----------------------------------------------------------------------

    async def repair(self, rung: Rung) -> Rung | None:
        """Wait for a human's decision on `rung`; remind once, then apply the policy.

        Returns the rung approved, or None when a more severe fault raised the incident's
        rung before anyone decided (the caller asks again, for the new rung).
        """
        inc = self.incident
        s, p = inc.state, inc.policy
        self._wait_for(rung.value, f"one of {p.approvers}")

        async def decided() -> ApprovalRecord | None:
            text = f"{rung.value} of {s.request.node} needs approval by one of {p.approvers}"
            await inc.notify("approval_needed", text, "warning")
            timeout = timedelta(seconds=p.approval_timeout_s)
            for reminder in (True, False):
                try:
                    await workflow.wait_condition(
                        lambda: self.decision is not None or s.rung != rung.value,
                        timeout=timeout,
                    )
                    return self.decision
                except TimeoutError:
                    if reminder:
                        await inc.notify("approval_reminder", "still waiting: " + text, "warning")
            if p.approval_timeout_action == "proceed":
                return self.decide(
                    ApprovalRequest(step=rung.value, approver="policy:timeout"), approved=True
                )
            raise Unattended(f"no decision on {rung.value} within {2 * p.approval_timeout_s:.0f}s")

        try:
            d = await inc.steps.step(
                "approval",
                decided,
                detail=lambda d: (
                    f"{'approved' if d.approved else 'rejected'} by {d.approver}"
                    if d
                    else f"none: a more severe fault raised the rung to {s.rung}"
                ),
            )
        finally:
            self._done_waiting()
        if d is None:
            return None
        if not d.approved:
            raise Rejected(
                f"{d.step} rejected by {d.approver}" + (f": {d.comment}" if d.comment else "")
            )
        return Rung(d.step)

    async def release_lemon(self, text: str) -> None:
        """A lemon node (core/lemon.py) passed its gate: wait, for as long as it takes, for
        an approver to release it (returns) or keep it out (Rejected). Reminded every
        approval timeout: only a person returns a lemon."""
        inc = self.incident
        p = inc.policy
        self._wait_for(LEMON_STEP, f"release or keep out; one of {p.approvers}")

        async def decided() -> ApprovalRecord:
            await inc.notify("approval_needed", text, "critical")
            while True:
                try:
                    await workflow.wait_condition(
                        lambda: self.decision is not None,
                        timeout=timedelta(seconds=p.approval_timeout_s),
                    )
                    assert self.decision is not None
                    return self.decision
                except TimeoutError:
                    await inc.notify("approval_reminder", "still held: " + text, "critical")

        try:
            d = await inc.steps.step(
                LEMON_STEP,
                decided,
                detail=lambda d: f"{'released' if d.approved else 'kept out'} by {d.approver}",
            )
        finally:
            self._done_waiting()
        if not d.approved:
            raise Rejected(
                f"lemon kept out by {d.approver}" + (f": {d.comment}" if d.comment else "")
            )

    async def returned_jobs(self, jobs: list[int]) -> bool:
        """Jobs requeued once run on the node again: True to cancel them (approved), False
        to wait for them to end (rejected)."""
        inc = self.incident
        req, p = inc.request, inc.policy
        self._wait_for(
            RETURNED_JOBS_STEP, f"cancel jobs {jobs} or wait for them; one of {p.approvers}"
        )

        async def decided() -> ApprovalRecord:
            text = (
                f"{RETURNED_JOBS_STEP} of {req.node} needs approval by one of {p.approvers}: "
                f"jobs {jobs} were requeued once for {req.fault} and run on {req.node} again. "
                f"Approve: cancel them; reject: wait for them to end"
            )
            await inc.notify("approval_needed", text, "warning")
            try:
                await workflow.wait_condition(
                    lambda: self.decision is not None,
                    timeout=timedelta(seconds=p.returned_jobs_timeout_s),
                )
            except TimeoutError:
                raise Unattended(
                    f"no decision on jobs {jobs} back on {req.node} within "
                    f"{p.returned_jobs_timeout_s:.0f}s"
                ) from None
            assert self.decision is not None
            return self.decision

        try:
            d = await inc.steps.step(
                RETURNED_JOBS_STEP,
                decided,
                detail=lambda d: (
                    f"cancel jobs {jobs}: approved by {d.approver}"
                    if d.approved
                    else f"wait for jobs {jobs}: {d.approver}"
                ),
            )
        finally:
            self._done_waiting()
        return d.approved

    def _wait_for(self, step: str, detail: str) -> None:
        s = self.incident.state
        s.waiting_for = Waiting(kind="approval", step=step, detail=detail, since=workflow.now())
        self.decision = None
        self.incident.publish()

    def _done_waiting(self) -> None:
        self.incident.state.waiting_for = None
        self.incident.publish()
