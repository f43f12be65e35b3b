"""Starting and steering a cluster's GpuRebalance: the CLI, the demo and the API use these."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import FailureError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.sharing import (
    REBALANCE_WORKFLOW,
    ClearUnhealthy,
    MoveDecision,
    MoveRequest,
    RebalanceInput,
    SharePolicy,
    ShareStatus,
    rebalance_workflow_id,
)


class RebalancerNotRunning(RuntimeError):
    pass


class MoveRefused(PermissionError):
    """A decision the rebalancer refused: no such move, or it is not waiting for one
    (already decided, running, finished), or no rebalancer runs. The message says which."""


async def start_rebalancer(
    client: Client, cluster: str, policy: SharePolicy, task_queue: str
) -> WorkflowHandle[object, None]:
    """Start the cluster's rebalancer, or give the running one this policy."""
    wid = rebalance_workflow_id(cluster)
    handle: WorkflowHandle[object, None] = await client.start_workflow(
        REBALANCE_WORKFLOW,
        RebalanceInput(cluster=cluster, policy=policy),
        id=wid,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    await handle.signal("set_policy", policy)
    return handle


def _handle(client: Client, cluster: str) -> WorkflowHandle[object, None]:
    return client.get_workflow_handle(rebalance_workflow_id(cluster))


async def share_status(client: Client, cluster: str) -> ShareStatus:
    try:
        status: ShareStatus = await _handle(client, cluster).query(
            "status", result_type=ShareStatus
        )
    except RPCError as e:
        raise RebalancerNotRunning(
            f"no GPU rebalancer for cluster {cluster} ({e.message}); "
            f"start one with `autoclusters share start`"
        ) from None
    return status


async def request_move(client: Client, cluster: str, req: MoveRequest) -> str:
    """Queue a person's move; the validator refuses an unknown node, one already in that
    pool, moving, or in an incident (nothing is queued then)."""
    move_id: str = await _handle(client, cluster).execute_update(
        "request_move", req, result_type=str
    )
    return move_id


async def decide_move(client: Client, cluster: str, decision: MoveDecision) -> str:
    """Approve or reject the move waiting for a human: `approved` or `rejected`. The
    rebalancer's validator refuses a move that is not waiting (MoveRefused, with its
    reason; nothing is recorded then). The CLI and Slack's buttons decide through here."""
    try:
        outcome: str = await _handle(client, cluster).execute_update(
            "decide_waiting_move", decision, result_type=str
        )
    except WorkflowUpdateFailedError as e:
        # The validator's words, without the exception type the SDK puts in front.
        cause = e.cause
        raise MoveRefused(cause.message if isinstance(cause, FailureError) else str(e)) from e
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise MoveRefused(
                f"no GPU rebalancer for cluster {cluster}, so no move {decision.move_id}"
            ) from e
        raise
    return outcome


async def clear_unhealthy(client: Client, cluster: str, req: ClearUnhealthy) -> str:
    """Take a node off the rebalancer's failed-its-gate list; MoveRefused (with the
    reason) when it is not listed or no rebalancer runs."""
    try:
        done: str = await _handle(client, cluster).execute_update(
            "clear_unhealthy", req, result_type=str
        )
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        raise MoveRefused(cause.message if isinstance(cause, FailureError) else str(e)) from e
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise MoveRefused(f"no GPU rebalancer for cluster {cluster}") from e
        raise
    return done


async def evaluate_now(client: Client, cluster: str, why: str) -> bool:
    """Ask the rebalancer to evaluate at once; False when none runs."""
    try:
        await _handle(client, cluster).signal("evaluate_now", why)
    except RPCError:
        return False
    return True
