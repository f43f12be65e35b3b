"""Borrowed from inference (core/sharing_borrow.py): while a training node is repaired, an
inference node is lent to the training job the incident narrowed, and given back once the
repaired node serves again. Each is a move through the other direction's steps, told in the
incident's own Slack thread.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.sharing import Borrow, Demand, Direction, Move, Verdict
    from autoclusters.core.sharing_borrow import BorrowVerdict, decide_borrow

from autoclusters.workflows.sharing.moves import Moves
from autoclusters.workflows.sharing.run import SharingRun

KEEP_BORROWS = 20


class Borrowing:
    """Decides and carries out borrows, through the sharing workflow's moves."""

    def __init__(self, sh: SharingRun, moves: Moves) -> None:
        self._sh = sh
        self._moves = moves

    async def turn(self, demand: Demand, verdict: Verdict) -> bool:
        """Lend an inference node to a training job an incident narrowed, or give one
        back; True when a node moved (the evaluation's move)."""
        sh, s = self._sh, self._sh.state
        b = decide_borrow(
            demand,
            sh.policy,
            lost=s.lost,
            borrows=s.borrows,
            barred=set(s.unhealthy) | set(s.yielded),
            inference_breached=(
                verdict.to == "inference" or verdict.breach_streak >= sh.policy.sustain
            ),
            now=workflow.now().timestamp(),
        )
        s.last_borrow_verdict = b.why
        if b.action is None or b.node is None or b.for_node is None:
            return False
        if b.action == "borrow":
            await self._borrow(demand, b)
            return True
        out = next(x for x in s.borrows if x.status == "lent" and x.node == b.node)
        if b.action == "taken":
            out.status, out.ended_why = "taken", b.why
            await sh.notices.borrow(out, "borrow_ended", f"{b.why}.", "warning")
            return False
        await self._give_back(demand, out, b.why)
        return True

    async def _borrow(self, demand: Demand, b: BorrowVerdict) -> None:
        """The inference node goes to training through a return's steps: scaled off, back
        in the training pool, the health gate (a node is never lent sick), resumed, and
        the lost node's jobs regrown onto it from their checkpoint (pending ones start)."""
        assert b.node is not None and b.for_node is not None
        sh, s = self._sh, self._sh.state
        lost = s.lost[b.for_node]
        move = self._move(b.node, "training", f"borrowed for {b.for_node}: {b.why}", demand)
        out = Borrow(
            node=b.node,
            for_node=b.for_node,
            incident_id=lost.incident_id,
            fault=lost.fault,
            jobs=dict(lost.jobs),
            why=b.why,
            started_at=workflow.now().timestamp(),
            move_id=move.move_id,
        )
        s.borrows.append(out)
        del s.borrows[:-KEEP_BORROWS]
        for job_id, width in lost.jobs.items():
            s.narrowed.setdefault(job_id, width)
        rec = await self._moves.run(move)
        jobs = ", ".join(str(j) for j in sorted(out.jobs))
        if rec.status == "done":
            out.status, out.lent_at = "lent", rec.finished_at
            await sh.notices.borrow(
                out,
                "borrowed_from_inference",
                f"{b.node} lent from inference to training while {b.for_node} is repaired "
                f"(move {move.move_id}): job(s) {jobs} keep their width. It goes back to "
                f"inference once {b.for_node} is in service again. Why: {b.why}.",
                "info",
            )
        else:
            out.status, out.ended_why = "failed", rec.error or rec.status
            await sh.notices.borrow(
                out,
                "borrow_failed",
                f"no node borrowed from inference for {b.for_node}: move {move.move_id} "
                f"{rec.status}{': ' + rec.error if rec.error else ''}.",
                "warning",
            )

    async def _give_back(self, demand: Demand, out: Borrow, why: str) -> None:
        """The borrowed node goes back to inference through a lend's steps: its jobs are
        asked to checkpoint and requeue (they start again at full width on the repaired
        node), then it serves again. It needs no approval: the borrow was the decision."""
        sh = self._sh
        reason = f"give back the node borrowed for {out.for_node}: {why}"
        move = self._move(out.node, "inference", reason, demand)
        out.status, out.give_back_move = "giving_back", move.move_id
        rec = await self._moves.run(move, approval=False)
        if rec.status == "done":
            out.status, out.returned_at = "returned", rec.finished_at
            await sh.notices.borrow(
                out,
                "borrow_returned",
                f"{out.node} given back to inference (move {move.move_id}): {why}; its "
                f"training job(s) requeued from their checkpoint onto the cluster's free nodes.",
                "info",
            )
        else:
            out.status, out.ended_why = (
                "taken" if rec.status == "yielded" else "failed",
                rec.error or rec.status,
            )
            await sh.notices.borrow(
                out,
                "borrow_failed",
                f"{out.node} not given back to inference (move {move.move_id} {rec.status}"
                f"{': ' + rec.error if rec.error else ''}).",
                "warning",
            )

    def _move(self, node: str, to: Direction, reason: str, demand: Demand) -> Move:
        return Move(move_id=self._sh.next_move_id(), node=node, to=to, reason=reason, demand=demand)
