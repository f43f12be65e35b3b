"""An incident asks the cluster's sharing workflow for a node it holds (lent to inference, or in
a move). A workflow cannot send an update to another workflow, so the incident does it
through this activity; no sharing workflow running means nobody holds the node."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client, RPCError, WorkflowUpdateFailedError
from temporalio.service import RPCStatusCode

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.sharing import YieldCall, YieldResult, sharing_workflow_id


class ShareYieldActivities:
    def __init__(self, client: Client) -> None:
        self._client = client

    @activity.defn(name="share_yield_node")
    async def yield_node(self, call: YieldCall) -> YieldResult:
        async with heartbeating(f"share_yield_node {call.node}"):
            handle = self._client.get_workflow_handle(sharing_workflow_id(call.cluster))
            try:
                result: YieldResult = await handle.execute_update(
                    "yield_node",
                    call,
                    result_type=YieldResult,
                    id=f"yield-{call.incident_id}-{call.node}",
                )
            except RPCError as e:
                if e.status == RPCStatusCode.NOT_FOUND:
                    return YieldResult(held=False)
                raise
            except WorkflowUpdateFailedError as e:
                if "not found" in str(e.cause).lower():
                    return YieldResult(held=False)
                raise
            return result
