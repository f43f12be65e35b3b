"""The fleet guard's circuit breaker, asked through Temporal: its status (`autoclusters
breaker status`, clients/cli/breaker.py), and a reset by an approver, which the API makes
(`POST /v1/breaker/reset`, for `autoclusters breaker reset`) once it knows who they are:
it signs the proof of who resets that the guard's worker checks (core/decision_proof.py).

The guard (one workflow per cluster) starts with the cluster's first incident. These
calls only read or reset it; they never start one.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.decision_proof import Decision, sign
from autoclusters.core.guard import (
    BREAKER_RESET_STEP,
    BreakerStatus,
    GuardStatus,
    ResetRequest,
    guard_workflow_id,
    reset_subject,
)
from autoclusters.workflows.fleet_guard import FleetGuard

# A guard that does not answer within this long has no worker polling its task queue.
ANSWER_TIMEOUT = timedelta(seconds=15)


class GuardError(RuntimeError):
    """The guard could not be asked: not started, not running, or not answering."""


class GuardNotStarted(GuardError, LookupError):
    pass


class BreakerNotTripped(GuardError):
    pass


class NotAnApprover(GuardError):
    """The reset was refused: only the policy's approvers may reset the breaker."""


def _handle(client: Client, cluster: str) -> WorkflowHandle[FleetGuard, None]:
    return client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(cluster))


def _not_started(cluster: str) -> GuardNotStarted:
    return GuardNotStarted(
        f"the fleet guard of cluster {cluster} ({guard_workflow_id(cluster)}) is not running; "
        "it starts with the cluster's first incident"
    )


def _no_answer(cluster: str) -> GuardError:
    return GuardError(
        f"the fleet guard of cluster {cluster} did not answer within "
        f"{ANSWER_TIMEOUT.total_seconds():.0f} s: is a worker running?"
    )


async def breaker_status(client: Client, cluster: str) -> GuardStatus:
    """The guard's state: breaker, limits, nodes out of service and repairing."""
    try:
        return await _handle(client, cluster).query(FleetGuard.status, rpc_timeout=ANSWER_TIMEOUT)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _not_started(cluster) from None
        if e.status == RPCStatusCode.DEADLINE_EXCEEDED:
            raise _no_answer(cluster) from None
        raise


async def reset_breaker(
    client: Client, cluster: str, by: str, *, key: str, via: str
) -> BreakerStatus:
    """`by` resets the tripped breaker, whom the caller (the API) has verified `via` their
    own token (`token:<name>`) or Slack: the reset carries a proof signed with `key` (the
    first of `[approval] keys`) for this trip, which the guard's worker checks. Repairs are
    admitted again."""
    status = await breaker_status(client, cluster)
    tripped_at = status.state.breaker.tripped_at
    if not status.state.breaker.tripped or tripped_at is None:
        raise BreakerNotTripped(f"the circuit breaker of {cluster} is not tripped")
    subject = reset_subject(cluster, tripped_at)
    proof = sign(Decision(subject, BREAKER_RESET_STEP, by, True, via), key)
    return await send_reset(client, cluster, ResetRequest(by=by, proof=proof))


async def send_reset(client: Client, cluster: str, req: ResetRequest) -> BreakerStatus:
    """Send a reset as it is (with its proof, or not: the guard refuses it then)."""
    try:
        return await _handle(client, cluster).execute_update(
            FleetGuard.reset_breaker, req, rpc_timeout=ANSWER_TIMEOUT
        )
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        if isinstance(cause, ApplicationError) and cause.type == "BreakerNotTripped":
            raise BreakerNotTripped(cause.message) from None
        if isinstance(cause, ApplicationError) and cause.type == "NotAnApprover":
            raise NotAnApprover(f"reset refused: {cause.message}") from None
        if isinstance(cause, ApplicationError) and cause.type == "DecisionRefused":
            raise GuardError(cause.message) from None  # it says "reset refused" itself
        raise GuardError(f"reset refused: {getattr(cause, 'message', None) or cause}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise _no_answer(cluster) from None
    except RPCError as e:
        # Not found: never started, or its run is closed (it normally never ends).
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _not_started(cluster) from None
        raise
