"""Starting and steering a cluster's GpuSharing: the CLI, the demo and the API use these."""

from __future__ import annotations

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import FailureError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.decision_proof import Decision, sign
from autoclusters.core.sharing import (
    MOVE_APPROVAL_STEP,
    SHARING_WORKFLOW,
    ClearUnhealthy,
    MoveDecision,
    MoveRequest,
    SharePolicy,
    ShareStatus,
    SharingInput,
    move_subject,
    sharing_workflow_id,
)


class SharingNotRunning(RuntimeError):
    pass


class MoveRefused(PermissionError):
    """What the sharing workflow refused: a move it cannot make, a decision on a move not waiting
    for one (unknown, decided, running, finished), a node it cannot clear, or no sharing workflow
    runs. The message says which."""


async def start_sharing(
    client: Client, cluster: str, policy: SharePolicy, task_queue: str
) -> WorkflowHandle[object, None]:
    """Start the cluster's sharing workflow, or give the running one this policy."""
    wid = sharing_workflow_id(cluster)
    handle: WorkflowHandle[object, None] = await client.start_workflow(
        SHARING_WORKFLOW,
        SharingInput(cluster=cluster, policy=policy),
        id=wid,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    await handle.signal("set_policy", policy)
    return handle


def _handle(client: Client, cluster: str) -> WorkflowHandle[object, None]:
    return client.get_workflow_handle(sharing_workflow_id(cluster))


async def share_status(client: Client, cluster: str) -> ShareStatus:
    try:
        status: ShareStatus = await _handle(client, cluster).query(
            "status", result_type=ShareStatus
        )
    except RPCError as e:
        raise SharingNotRunning(
            f"GPU sharing is not running for cluster {cluster} ({e.message}); "
            f"start it with `autoclusters share start`"
        ) from None
    return status


async def _update(client: Client, cluster: str, name: str, arg: object, nobody: str) -> str:
    """Run one of the sharing workflow's validated updates. A refusal raises MoveRefused with the
    validator's words (without the exception type the SDK puts in front); no sharing workflow
    raises it with `nobody`."""
    try:
        answer: str = await _handle(client, cluster).execute_update(name, arg, result_type=str)
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        raise MoveRefused(cause.message if isinstance(cause, FailureError) else str(e)) from e
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise MoveRefused(f"GPU sharing is not running for cluster {cluster}{nobody}") from e
        raise
    return answer


async def request_move(client: Client, cluster: str, req: MoveRequest) -> str:
    """Queue a person's move; the move id. The validator refuses an unknown node, one
    already in that pool, moving, or in an incident (MoveRefused; nothing is queued)."""
    return await _update(client, cluster, "request_move", req, "")


def proven_decision(
    cluster: str, move_id: str, approve: bool, by: str, *, key: str, via: str
) -> MoveDecision:
    """`by`'s decision on a move, whom the caller (the API) has verified `via` their own
    token (`token:<name>`) or Slack's signed click (`slack:<user id>`): with a proof
    signed with `key` (the first of `[approval] keys`), which the sharing workflow's worker
    checks."""
    d = Decision(move_subject(cluster, move_id), MOVE_APPROVAL_STEP, by, approve, via)
    return MoveDecision(move_id=move_id, approve=approve, by=by, proof=sign(d, key))


async def decide_move(client: Client, cluster: str, decision: MoveDecision) -> str:
    """Approve or reject the move waiting for a human: `approved` or `rejected`. The
    sharing workflow's validator refuses a move that is not waiting, or a decision without a
    proof (MoveRefused, with its reason; nothing is recorded then), and its worker a proof
    that does not hold. The API (for the CLI) and Slack's buttons decide through here, with
    `proven_decision`."""
    nobody = f", so no move {decision.move_id}"
    return await _update(client, cluster, "decide_waiting_move", decision, nobody)


async def clear_unhealthy(client: Client, cluster: str, req: ClearUnhealthy) -> str:
    """Take a node off the sharing workflow's failed-its-gate list; MoveRefused (with the
    reason) when it is not listed or no sharing workflow runs."""
    return await _update(client, cluster, "clear_unhealthy", req, "")


async def evaluate_now(client: Client, cluster: str, why: str) -> bool:
    """Ask the sharing workflow to evaluate at once; False when none runs."""
    try:
        await _handle(client, cluster).signal("evaluate_now", why)
    except RPCError:
        return False
    return True
