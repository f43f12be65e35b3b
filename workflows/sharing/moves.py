"""One move from end to end: the node is `moving` (the move's alone) -> approval when the
policy asks for one -> lent or returned -> in its new pool, or where the move left it. A
move that fails is told; one people were asked about says how it ended.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.sharing import BY_SHARING, Move, MoveRecord, Pool

from autoclusters.workflows.sharing.approval import MoveApproval
from autoclusters.workflows.sharing.lending import lend
from autoclusters.workflows.sharing.move_steps import MoveStopped
from autoclusters.workflows.sharing.returning import AgentCheck, return_to_training
from autoclusters.workflows.sharing.run import SharingRun
from autoclusters.workflows.steps import cause_of

KEEP_MOVES = 50


class Moves:
    """Runs the sharing workflow's moves, one at a time."""

    def __init__(self, sh: SharingRun, approval: MoveApproval, agent: AgentCheck) -> None:
        self._sh = sh
        self._approval = approval
        self._agent = agent  # the agent's half of a return's health gate

    async def run(self, move: Move, *, approval: bool = True) -> MoveRecord:
        """Carry `move` out; its record says how it ended."""
        sh, s = self._sh, self._sh.state
        rec = MoveRecord(move=move, started_at=workflow.now().timestamp())
        sh.current = rec
        s.moves.append(rec)
        del s.moves[:-KEEP_MOVES]
        before = s.pools.get(move.node, Pool.TRAINING)
        s.pools[move.node] = Pool.MOVING
        asked = approval and sh.policy.needs_approval and move.requested_by == BY_SHARING
        try:
            if asked:
                await self._approval.wait(rec)
            rec.status = "running"
            if move.to == "inference":
                await lend(sh, rec)
                s.pools[move.node] = Pool.INFERENCE
            else:
                passed = await return_to_training(sh, rec, self._agent)
                s.pools[move.node] = Pool.TRAINING if passed else Pool.MOVING
                if not passed:
                    rec.status = "failed"
                    s.unhealthy.append(move.node)
                    s.pools.pop(move.node, None)
            if rec.status == "running":
                rec.status = "done"
        except MoveStopped as e:
            rec.error = str(e)
            if move.node in s.yielded:
                rec.status = "yielded"
            else:
                rec.status = "rejected"
                s.pools[move.node] = before
        except ActivityError as e:
            rec.status = "failed"
            rec.error = str(cause_of(e))
            # Where the node is now is read again at the next evaluation.
            s.pools.pop(move.node, None)
            await sh.notices.move(move, "move_failed", f"{move.node}: {rec.error}", "warning")
        finally:
            rec.finished_at = workflow.now().timestamp()
            s.last_move_end = rec.finished_at
            sh.current = None
            sh.running_step = None
            if move.node in s.yielded:
                s.pools.pop(move.node, None)
        # People were asked about this move: its message says how it ended (and loses its
        # buttons: a decision on another channel, or none in time, leaves none to click).
        # A failure has told them already.
        if asked and rec.status != "failed":
            await sh.notices.outcome(rec)
        return rec
