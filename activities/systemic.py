"""A systemic incident, as seen from its members and from itself (docs/systemic.md).

`systemic_join`: a member incident joins its systemic incident (or reports again, once
drained). An update-with-start, as the guard's calls are: the first member starts the
systemic incident, every later one reaches it running. `systemic_close`: the systemic
incident tells the cluster's fleet guard it is over, so its members may be repaired again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.client import Client, WithStartWorkflowOperation, WorkflowUpdateFailedError
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.guard import CloseSystemic, guard_workflow_id
from autoclusters.core.systemic import (
    SYSTEMIC_WORKFLOW,
    CloseSystemicCall,
    JoinAck,
    JoinCall,
    systemic_workflow_id,
)
from autoclusters.integrations import temporal


class SystemicActivities:
    def __init__(
        self,
        client: Client,
        task_queue: str,
        *,
        execution_timeout: timedelta | None = None,
    ) -> None:
        """`task_queue`: where a systemic incident started here runs. `execution_timeout`:
        for tests only."""
        self._client = client
        self._task_queue = task_queue
        self._execution_timeout = execution_timeout

    def activities(self) -> list[Any]:
        return [self.join, self.close]

    @activity.defn(name="systemic_join")
    async def join(self, call: JoinCall) -> JoinAck:
        s = call.start
        start: WithStartWorkflowOperation[Any, Any] = WithStartWorkflowOperation(
            SYSTEMIC_WORKFLOW,
            s,
            id=systemic_workflow_id(s.cluster, s.level, s.domain),
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            # A leaf that fails again after its last systemic incident closed: a new one.
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            execution_timeout=self._execution_timeout,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(temporal.INCIDENT_ID, s.incident_id),
                    SearchAttributePair(temporal.CLUSTER, s.cluster),
                    SearchAttributePair(temporal.NODE, s.domain),
                    SearchAttributePair(temporal.FAULT, call.join.fault),
                    SearchAttributePair(temporal.INCIDENT_STATUS, "open"),
                ]
            ),
            static_summary=f"systemic: {call.join.fault} on {s.level} {s.domain}",
        )
        try:
            async with heartbeating(f"join {s.incident_id}"):
                ack: JoinAck = await self._client.execute_update_with_start_workflow(
                    "join", call.join, start_workflow_operation=start, result_type=JoinAck
                )
                return ack
        except WorkflowUpdateFailedError as e:
            # Refused (closed, or not this systemic incident's member): asking again
            # cannot help; the member goes on on its own.
            raise ApplicationError(
                f"systemic incident {s.incident_id} refused {call.join.node}: {e.cause or e}",
                type="SystemicRefused",
                non_retryable=True,
            ) from e

    @activity.defn(name="systemic_close")
    async def close(self, call: CloseSystemicCall) -> list[str]:
        """Tell the guard the systemic incident is over; the members it had."""
        handle = self._client.get_workflow_handle(guard_workflow_id(call.guard.cluster))
        members: list[str] = await handle.execute_update(
            "close_systemic", CloseSystemic(incident_id=call.incident_id), result_type=list[str]
        )
        return members
