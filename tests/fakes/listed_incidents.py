"""Incidents for `incident list` and `GET /v1/incidents` to find on a Temporal dev server:
a node's incident as visibility shows it (a stand-in workflow registered as
NodeRemediation, with the search attributes the real one carries; the list reads no more
of it), and a real SystemicIncident whose members join with its real `join` update, as
the members' incidents do (no activity worker: it stays at its first step, `open`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError

from autoclusters.core.guard import GuardContext
from autoclusters.core.policy import TopologyLevel
from autoclusters.core.systemic import (
    MemberJoin,
    SystemicRequest,
    systemic_incident_id,
    systemic_workflow_id,
)
from autoclusters.integrations import temporal
from autoclusters.workflows.systemic_incident import SystemicIncident

# Ends with the test's server, or within this.
EXECUTION_TIMEOUT = timedelta(minutes=10)


# Not sandboxed: it does nothing but wait, and this module's imports (the Temporal client,
# the settings) are not the sandbox's to re-import.
@workflow.defn(name="NodeRemediation", sandboxed=False)
class ListedNodeIncident:
    """A node's incident, as far as the list reads one: open until the server goes."""

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)


async def open_node_incident(
    client: Client, queue: str, cluster: str, node: str, fault: str, at: datetime
) -> str:
    """A node's open incident; its id."""
    incident_id = f"inc-{at:%Y%m%d-%H%M%S}-{node}"
    await client.start_workflow(
        ListedNodeIncident.run,
        id=f"remediation-{cluster}-{node}-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
        execution_timeout=EXECUTION_TIMEOUT,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(temporal.INCIDENT_ID, incident_id),
                SearchAttributePair(temporal.CLUSTER, cluster),
                SearchAttributePair(temporal.NODE, node),
                SearchAttributePair(temporal.FAULT, fault),
                SearchAttributePair(temporal.INCIDENT_STATUS, "open"),
            ]
        ),
    )
    return incident_id


async def open_systemic(
    client: Client,
    queue: str,
    cluster: str,
    level: TopologyLevel,
    domain: str,
    at: datetime,
    joined: dict[str, str],
    known: list[str],
) -> str:
    """A systemic incident of `domain` whose members `joined` (node -> fault) joined,
    drained, and the guard knew `known` besides; its id. On a queue no worker polls, it
    never answers its status query."""
    incident_id = systemic_incident_id(domain, at)
    req = SystemicRequest(
        incident_id=incident_id, cluster=cluster, level=level, domain=domain, opened_at=at,
        nodes=[*joined, *known], guard=GuardContext(cluster=cluster),
    )  # fmt: skip
    handle = await client.start_workflow(
        SystemicIncident.run,
        req,
        id=systemic_workflow_id(cluster, level, domain),
        task_queue=queue,
        execution_timeout=EXECUTION_TIMEOUT,
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(temporal.INCIDENT_ID, incident_id),
                SearchAttributePair(temporal.CLUSTER, cluster),
                SearchAttributePair(temporal.NODE, domain),
            ]
        ),
    )
    for node, fault in joined.items():
        join = MemberJoin(
            node=node, incident_id=f"inc-{at:%Y%m%d-%H%M%S}-{node}",
            workflow_id=f"remediation-{cluster}-{node}", fault=fault, drained=True,
        )  # fmt: skip
        await join_member(handle, join)
    return incident_id


async def join_member(handle: WorkflowHandle[Any, Any], join: MemberJoin) -> None:
    """The member's join, as its activity makes it: asked again while the server refuses
    for now (on a loaded machine a workflow task can time out, and an update sent then is
    refused until the task is retried)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            await handle.execute_update(SystemicIncident.join, join)
            return
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


AT = datetime(2026, 12, 5, 18, 0, 5, tzinfo=UTC)
