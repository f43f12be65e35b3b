"""What people ask of the sharing workflow outside its own decisions: a move of their own (run
through the same steps, with no approval), and a node that failed its gate on return
cleared once they fixed it. The checks refuse, with the reason, what cannot be done.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.sharing import ClearUnhealthy, Move, MoveRequest, Pool

from autoclusters.workflows.sharing.run import SharingRun


def queue_move(sh: SharingRun, req: MoveRequest) -> str:
    """A person's move, queued for the next turn; its id."""
    move = Move(
        move_id=sh.next_move_id(),
        node=req.node,
        to=req.to,
        reason=f"asked by {req.requested_by}",
        requested_by=req.requested_by,
    )
    sh.state.queued.append(move)
    return move.move_id


def check_move(sh: SharingRun, req: MoveRequest) -> None:
    """A known node, bound for the pool it is not in, held by no move, incident or borrow."""
    s = sh.state
    known = s.last_demand.nodes if s.last_demand else []
    node = next((n for n in known if n.name == req.node), None)
    if node is None:
        raise ValueError(f"{req.node} is not a GPU node this sharing workflow can move")
    pool = s.pools.get(req.node, node.pool)
    want = Pool.INFERENCE if req.to == "inference" else Pool.TRAINING
    if pool == want:
        raise ValueError(f"{req.node} is already in the {want.value} pool")
    if pool == Pool.MOVING or any(m.node == req.node for m in s.queued):
        raise ValueError(f"{req.node} is already moving")
    if node.in_incident or req.node in s.yielded:
        raise ValueError(f"{req.node} is in a remediation incident")
    lent = next((b for b in s.borrows if b.active and b.node == req.node), None)
    if lent is not None:
        raise ValueError(
            f"{req.node} is lent to training while {lent.for_node} is repaired (incident "
            f"{lent.incident_id}); it goes back to inference on its own"
        )


def clear(sh: SharingRun, req: ClearUnhealthy) -> str:
    """Neither pool is barred from the node any more; it stays drained in Slurm until a
    person resumes it (the sharing workflow never resumes a node it did not gate itself)."""
    sh.state.unhealthy.remove(req.node)
    workflow.logger.info("%s cleared by %s", req.node, req.by)
    return f"{req.node} cleared by {req.by}"


def check_clear(sh: SharingRun, req: ClearUnhealthy) -> None:
    """Who cleared it, and a node that did fail its gate."""
    if not req.by.strip():
        raise ValueError("clearing a node needs the name of who cleared it")
    if req.node not in sh.state.unhealthy:
        listed = ", ".join(sh.state.unhealthy) or "none"
        raise ValueError(f"{req.node} is not listed as failed its health gate (listed: {listed})")
