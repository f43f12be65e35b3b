"""A move that waits for a human (`needs_approval`), and the decisions that answer it: the
`decide_waiting_move` update (the API, for the CLI and Slack's buttons) with the API's proof
of who decided, which the worker checks before it counts (activities/decisions.py).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.models import ProofCheck
    from autoclusters.core.sharing import (
        MOVE_APPROVAL_STEP,
        MoveDecision,
        MoveRecord,
        move_subject,
    )

from autoclusters.workflows.sharing.move_steps import MoveStopped, stop_if_taken
from autoclusters.workflows.sharing.run import SharingRun

# docs/versioning.md: a decision on a move counted on the name it gave (by the update, or the
# `decide_move` signal); now the worker checks the API's proof of who decided
# (`check_decision_proof`, a local activity) first, and the signal decides nothing.
# Patch ids keep the workflow's old module name: recorded histories carry them.
DECISION_PROOF_PATCH = "gpu_rebalance-0.2-decision-proof"


class MoveApproval:
    """The decisions taken on waiting moves, by move id, until their move reads them."""

    def __init__(self, sh: SharingRun) -> None:
        self._sh = sh
        self._decisions: dict[str, MoveDecision] = {}

    async def wait(self, rec: MoveRecord) -> None:
        """Ask people, and wait for their decision: raises MoveStopped on a no, on none
        in time, or when an incident takes the node meanwhile."""
        sh, move = self._sh, rec.move
        rec.status = "waiting_approval"
        await sh.notices.move(
            move,
            "approval_needed",
            f"move {move.move_id}: {move.node} to {move.to} ({move.reason}) needs approval. "
            f"Approve or reject with the buttons, or `autoclusters share approve "
            f"{move.move_id}` / `autoclusters share reject {move.move_id}`.",
            "warning",
        )
        try:
            await workflow.wait_condition(
                lambda: move.move_id in self._decisions or move.node in sh.state.yielded,
                timeout=timedelta(seconds=sh.policy.approval_timeout_s),
            )
        except TimeoutError:
            raise MoveStopped("nobody approved in time") from None
        stop_if_taken(sh, move.node)
        decision = self._decisions.pop(move.move_id)
        if not decision.approve:
            raise MoveStopped(f"rejected by {decision.by}")
        rec.approved_by = decision.by

    def by_signal(self, decision: MoveDecision) -> None:
        """The `decide_move` signal: counts only on runs from before the proof."""
        if workflow.patched(DECISION_PROOF_PATCH):
            workflow.logger.warning(
                "decision on move %s by %s ignored: a decision is an update with the API's "
                "proof of who decided (`autoclusters share approve`, Slack)",
                decision.move_id,
                decision.by,
            )
            return
        self._decisions[decision.move_id] = decision

    async def proven(self, decision: MoveDecision) -> str:
        """The `decide_waiting_move` update: the proof checked, then the decision counts.
        Returns what it did: `approved` or `rejected`."""
        # Runs started before proofs took a decision on its name alone; their replays must
        # issue no check (docs/versioning.md).
        if workflow.patched(DECISION_PROOF_PATCH):
            verdict = await workflow.execute_local_activity(
                contracts.check_decision_proof,
                ProofCheck(
                    proof=decision.proof,
                    subject=move_subject(self._sh.cluster, decision.move_id),
                    step=MOVE_APPROVAL_STEP,
                    approver=decision.by,
                    approve=decision.approve,
                ),
                start_to_close_timeout=timedelta(seconds=10),
            )
            try:
                if not verdict.ok:
                    raise ValueError(verdict.reason)
                self.check_state(decision)  # again: it may have moved on meanwhile
            except ValueError as e:
                workflow.logger.warning(
                    "decision on move %s by %s refused: %s", decision.move_id, decision.by, e
                )
                raise ApplicationError(str(e), type="DecisionRefused", non_retryable=True) from None
        self._decisions[decision.move_id] = decision
        return "approved" if decision.approve else "rejected"

    def check(self, decision: MoveDecision) -> None:
        """The update's validator: a move waiting now, and a proof to check."""
        self.check_state(decision)
        if not decision.proof:
            raise ValueError(
                "no proof of who decides: decide through the API (`autoclusters share "
                "approve|reject` with your operator token) or Slack's buttons"
            )

    def check_state(self, decision: MoveDecision) -> None:
        """Refuses, with the reason, a decision on a move that is not waiting for one."""
        sh, s = self._sh, self._sh.state
        if not decision.by.strip():
            raise ValueError("a decision needs the name of who decides")
        cur = sh.current
        if cur is not None and cur.move.move_id == decision.move_id:
            if cur.status != "waiting_approval":
                raise ValueError(
                    f"move {decision.move_id} is not waiting for approval: {cur.status}"
                )
            if decision.move_id in self._decisions:
                raise ValueError(f"move {decision.move_id} is already decided")
            if cur.move.node in s.yielded:
                raise ValueError(
                    f"move {decision.move_id} is stopping: incident "
                    f"{s.yielded[cur.move.node]} took {cur.move.node}"
                )
            return
        past = next((m for m in reversed(s.moves) if m.move.move_id == decision.move_id), None)
        if past is None:
            if any(m.move_id == decision.move_id for m in s.queued):
                raise ValueError(f"move {decision.move_id} is queued, not waiting for approval")
            raise ValueError(f"no move {decision.move_id} on cluster {sh.cluster}")
        by = f" by {past.approved_by}" if past.approved_by else ""
        why = f" ({past.error})" if past.error else ""
        raise ValueError(
            f"move {decision.move_id} is not waiting for approval: {past.status}{by}{why}"
        )
