"""The fleet guard's circuit breaker, asked through Temporal: its status, and a reset by an
approver (`autoclusters breaker status|reset`, clients/cli/breaker.py).

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

from autoclusters.core.guard import BreakerStatus, GuardStatus, ResetRequest, guard_workflow_id
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


async def reset_breaker(client: Client, cluster: str, by: str) -> BreakerStatus:
    """A human resets the tripped breaker; repairs are admitted again."""
    try:
        return await _handle(client, cluster).execute_update(
            FleetGuard.reset_breaker, ResetRequest(by=by), rpc_timeout=ANSWER_TIMEOUT
        )
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        if isinstance(cause, ApplicationError) and cause.type == "BreakerNotTripped":
            raise BreakerNotTripped(cause.message) from None
        if isinstance(cause, ApplicationError) and cause.type == "NotAnApprover":
            raise NotAnApprover(f"reset refused: {cause.message}") from None
        raise GuardError(f"reset refused: {getattr(cause, 'message', None) or cause}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise _no_answer(cluster) from None
    except RPCError as e:
        # Not found: never started, or its run is closed (it normally never ends).
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _not_started(cluster) from None
        raise
