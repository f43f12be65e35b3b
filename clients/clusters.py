"""The clusters ClusterProvisioning builds, as an operator reaches them through Temporal:
start (or attach to) a provisioning, read a cluster's state, start a scale or a teardown,
list the clusters.

A cluster *is* its provisioning workflow (`cluster-provisioning-<name>`): its start input
holds the spec (which a scale or teardown needs), its `status` query the progress. Scale and
teardown run as `cluster-ops-<name>`, one at a time. A cluster counts as deleted once a
ClusterTeardown started after its provisioning has completed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.cluster import (
    CLUSTER_PROVISIONING_WORKFLOW,
    ClusterProvisioningInput,
    ClusterRef,
    ClusterState,
    provisioning_workflow_id,
)
from autoclusters.core.cluster_ops import (
    CLUSTER_TEARDOWN_WORKFLOW,
    SCALE_NODE_SET_WORKFLOW,
    OpsState,
    ScaleNodeSetInput,
    TeardownInput,
    ops_workflow_id,
)
from autoclusters.core.cluster_spec import ClusterSpec
from autoclusters.core.policy import Policy
from autoclusters.core.settings import Settings
from autoclusters.workflows.cluster_ops import ClusterTeardown, ScaleNodeSet
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning

# A query no worker answers within this long: the display says so and keeps polling.
QUERY_TIMEOUT = timedelta(seconds=10)
POLL_S = 1.0


class ClusterNotFound(LookupError):
    """No provisioning workflow carries that cluster's name."""


class ClusterRefused(RuntimeError):
    """The operation cannot run now (still provisioning, busy, deleted, no such node set)."""


class Started(BaseModel):
    workflow_id: str
    run_id: str
    workflow_type: str
    attached: bool = False  # an already running workflow was joined, none started
    ui: str


class OpsView(BaseModel):
    workflow_id: str
    workflow_type: str
    temporal_status: str
    started_at: datetime
    closed_at: datetime | None = None
    state: OpsState | None = None
    ui: str


class ClusterView(BaseModel):
    cluster: str
    provider: str
    location: str
    workflow_id: str
    run_id: str
    temporal_status: str  # running, completed, failed, terminated, ...
    started_at: datetime
    closed_at: datetime | None = None
    deleted: bool = False
    state: ClusterState | None = None
    failure: str | None = None
    ops: OpsView | None = None  # the latest scale or teardown
    ui: str

    @property
    def ops_running(self) -> bool:
        return self.ops is not None and self.ops.temporal_status == "running"


class ClusterRow(BaseModel):
    name: str
    provider: str
    location: str
    status: str  # provisioning, ready, failed, deleting, deleted, ...
    started_at: datetime
    workflow_id: str


class Outcome(BaseModel):
    """How a watched workflow ended: `ok`, and otherwise why not."""

    ok: bool
    temporal_status: str
    message: str = ""
    failure_type: str | None = None


def ui_link(settings: Settings, workflow_id: str) -> str:
    root = settings.temporal.ui_url.rstrip("/")
    return f"{root}/namespaces/{settings.temporal.namespace}/workflows/{workflow_id}"


def _status(desc: WorkflowExecutionDescription) -> str:
    return desc.status.name.lower() if desc.status else "unknown"


async def _describe(client: Client, wf_id: str) -> WorkflowExecutionDescription | None:
    try:
        return await client.get_workflow_handle(wf_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def _provisioning(client: Client, cluster: str) -> WorkflowExecutionDescription:
    desc = await _describe(client, provisioning_workflow_id(cluster))
    if desc is None:
        raise ClusterNotFound(
            f"no cluster {cluster}: no provisioning workflow {provisioning_workflow_id(cluster)} "
            "(`autoclusters cluster list` shows the clusters)"
        )
    return desc


def _deleted(prov: WorkflowExecutionDescription, ops: WorkflowExecutionDescription | None) -> bool:
    return (
        ops is not None
        and ops.workflow_type == CLUSTER_TEARDOWN_WORKFLOW
        and ops.status == WorkflowExecutionStatus.COMPLETED
        and ops.start_time >= prov.start_time
    )


async def provisioned_input(client: Client, wf_id: str, run_id: str) -> ClusterProvisioningInput:
    """The spec and policy the cluster was provisioned with: its workflow's start input."""
    handle = client.get_workflow_handle(wf_id, run_id=run_id)
    async for event in handle.fetch_history_events(page_size=1):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            [inp] = await client.data_converter.decode(payloads, [ClusterProvisioningInput])
            if isinstance(inp, ClusterProvisioningInput):
                return inp
        break
    raise ClusterNotFound(f"{wf_id} has no readable start input")


# --- create --------------------------------------------------------------------------------


async def start_provisioning(
    client: Client, settings: Settings, spec: ClusterSpec, policy: Policy, agent_gate: bool = True
) -> Started:
    """Start the cluster's provisioning, or attach to the one already running."""
    wf_id = provisioning_workflow_id(spec.name)
    prov = await _describe(client, wf_id)
    ops = await _describe(client, ops_workflow_id(spec.name))
    if prov is not None and prov.status == WorkflowExecutionStatus.RUNNING:
        return _started(settings, prov, attached=True)
    if ops is not None and ops.status == WorkflowExecutionStatus.RUNNING:
        raise ClusterRefused(
            f"cluster {spec.name}: a {ops.workflow_type} runs ({ops.id}); "
            "create it again once that ends"
        )
    if prov is not None and prov.status == WorkflowExecutionStatus.COMPLETED:
        if not _deleted(prov, ops):
            raise ClusterRefused(
                f"cluster {spec.name} exists (provisioned {prov.start_time:%Y-%m-%d %H:%M} UTC); "
                f"`autoclusters cluster delete {spec.name}` first"
            )
    try:
        handle = await client.start_workflow(
            ClusterProvisioning.run,
            ClusterProvisioningInput(spec=spec, policy=policy, agent_gate=agent_gate),
            id=wf_id,
            task_queue=settings.temporal.task_queue,
            # What `cluster list` shows without reading every history.
            memo={"provider": spec.provider, "location": spec.location},
        )
    except WorkflowAlreadyStartedError:  # another `create` won the race: follow that one
        return _started(settings, await client.get_workflow_handle(wf_id).describe(), True)
    return Started(
        workflow_id=wf_id,
        run_id=handle.result_run_id or "",
        workflow_type=CLUSTER_PROVISIONING_WORKFLOW,
        ui=ui_link(settings, wf_id),
    )


def _started(settings: Settings, desc: WorkflowExecutionDescription, attached: bool) -> Started:
    return Started(
        workflow_id=desc.id,
        run_id=desc.run_id,
        workflow_type=desc.workflow_type,
        attached=attached,
        ui=ui_link(settings, desc.id),
    )


# --- status --------------------------------------------------------------------------------


async def _query(handle: WorkflowHandle[Any, Any], query: Any) -> Any:
    try:
        return await handle.query(query, rpc_timeout=QUERY_TIMEOUT)
    except RPCError:  # no worker answered, or the query failed: the caller shows the rest
        return None


async def _failure(handle: WorkflowHandle[Any, Any]) -> tuple[str, str | None]:
    """The message and type a closed, unsuccessful workflow ended with."""
    try:
        await handle.result()
    except WorkflowFailureError as e:
        cause = e.cause
        if isinstance(cause, ApplicationError):
            return cause.message, cause.type
        return str(cause or e), None
    return "", None


async def cluster_view(client: Client, settings: Settings, cluster: str) -> ClusterView:
    prov = await _provisioning(client, cluster)
    ops = await _describe(client, ops_workflow_id(cluster))
    inp = await provisioned_input(client, prov.id, prov.run_id)
    handle = client.get_workflow_handle(prov.id, run_id=prov.run_id, result_type=ClusterState)
    state: ClusterState | None
    failure = None
    if prov.status == WorkflowExecutionStatus.COMPLETED:
        state = await handle.result()  # from the history: no worker
    else:
        state = await _query(handle, ClusterProvisioning.status)
        if prov.status != WorkflowExecutionStatus.RUNNING:
            failure, _ = await _failure(handle)
    ops_view = None
    if ops is not None and ops.start_time >= prov.start_time:
        ops_handle = client.get_workflow_handle(ops.id, run_id=ops.run_id, result_type=OpsState)
        ops_state: OpsState | None
        if ops.status == WorkflowExecutionStatus.COMPLETED:
            ops_state = await ops_handle.result()
        else:
            ops_state = await _query(ops_handle, ScaleNodeSet.status)
        ops_view = OpsView(
            workflow_id=ops.id,
            workflow_type=ops.workflow_type,
            temporal_status=_status(ops),
            started_at=ops.start_time,
            closed_at=ops.close_time,
            state=ops_state,
            ui=ui_link(settings, ops.id),
        )
    return ClusterView(
        cluster=cluster,
        provider=inp.spec.provider,
        location=inp.spec.location,
        workflow_id=prov.id,
        run_id=prov.run_id,
        temporal_status=_status(prov),
        started_at=prov.start_time,
        closed_at=prov.close_time,
        deleted=_deleted(prov, ops),
        state=state,
        failure=failure or (state.failure if state else None),
        ops=ops_view,
        ui=ui_link(settings, prov.id),
    )


# --- watching ------------------------------------------------------------------------------


async def watch(
    client: Client,
    wf_id: str,
    run_id: str,
    query: Any,
    result_type: type,
    show: Callable[[Any | None], None],
    poll_s: float = POLL_S,
) -> Outcome:
    """Poll the workflow's `status` query, calling `show` with each answer (None: no worker
    answered), until the workflow closes; then show its last state and say how it ended."""
    handle = client.get_workflow_handle(wf_id, run_id=run_id, result_type=result_type)
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            break
        show(await _query(handle, query))
        await asyncio.sleep(poll_s)  # a poll interval, not a synchronisation
    status = _status(desc)
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        show(await handle.result())
        return Outcome(ok=True, temporal_status=status)
    last = await _query(handle, query)
    if last is not None:
        show(last)
    message, kind = await _failure(handle)
    return Outcome(ok=False, temporal_status=status, message=message or status, failure_type=kind)


# --- scale and delete ----------------------------------------------------------------------


async def settled(
    client: Client, cluster: str, what: str
) -> tuple[WorkflowExecutionDescription, ClusterProvisioningInput]:
    """The cluster's provisioning and spec, once that provisioning is over."""
    prov = await _provisioning(client, cluster)
    if prov.status == WorkflowExecutionStatus.RUNNING:
        raise ClusterRefused(
            f"cluster {cluster} is still being provisioned ({prov.id}): {what} it once that ends"
        )
    return prov, await provisioned_input(client, prov.id, prov.run_id)


async def _start_ops(
    client: Client, settings: Settings, cluster: str, run: Any, arg: Any
) -> Started:
    wf_id = ops_workflow_id(cluster)
    try:
        handle = await client.start_workflow(
            run, arg, id=wf_id, task_queue=settings.temporal.task_queue
        )
    except WorkflowAlreadyStartedError:
        running = await _describe(client, wf_id)
        kind = running.workflow_type if running else "scale or teardown"
        raise ClusterRefused(
            f"cluster {cluster} is busy: a {kind} already runs ({wf_id}); wait for it to end "
            f"({ui_link(settings, wf_id)})"
        ) from None
    desc_type = SCALE_NODE_SET_WORKFLOW if run is ScaleNodeSet.run else CLUSTER_TEARDOWN_WORKFLOW
    return Started(
        workflow_id=wf_id,
        run_id=handle.result_run_id or "",
        workflow_type=desc_type,
        ui=ui_link(settings, wf_id),
    )


async def start_scale(
    client: Client, settings: Settings, cluster: str, node_set: str, count: int
) -> Started:
    prov, inp = await settled(client, cluster, "scale")
    if _deleted(prov, await _describe(client, ops_workflow_id(cluster))):
        raise ClusterRefused(f"cluster {cluster} was deleted")
    if prov.status != WorkflowExecutionStatus.COMPLETED:
        raise ClusterRefused(
            f"cluster {cluster} is not ready (its provisioning {_status(prov)}): nothing to scale"
        )
    names = [s.name for s in inp.spec.node_sets]
    if node_set not in names:
        raise ClusterRefused(
            f"cluster {cluster} has no node set {node_set!r} (its node sets: {', '.join(names)})"
        )
    return await _start_ops(
        client,
        settings,
        cluster,
        ScaleNodeSet.run,
        ScaleNodeSetInput(
            spec=inp.spec,
            node_set=node_set,
            count=count,
            agent_gate=inp.agent_gate,
            agent_report_timeout_s=inp.policy.agent_report_timeout_s,
        ),
    )


async def start_teardown(client: Client, settings: Settings, cluster: str) -> Started:
    _, inp = await settled(client, cluster, "delete")
    spec = inp.spec
    ref = ClusterRef(name=spec.name, provider=spec.provider, location=spec.location)
    return await _start_ops(
        client, settings, cluster, ClusterTeardown.run, TeardownInput(cluster=ref)
    )


# --- list ----------------------------------------------------------------------------------

# WorkflowType and ExecutionStatus are built-in: these queries need no registered attribute.
_PROVISIONINGS = f"WorkflowType = '{CLUSTER_PROVISIONING_WORKFLOW}'"
_TEARDOWNS = f"WorkflowType = '{CLUSTER_TEARDOWN_WORKFLOW}'"
_STATUS_WORD = {
    WorkflowExecutionStatus.RUNNING: "provisioning",
    WorkflowExecutionStatus.COMPLETED: "ready",
    WorkflowExecutionStatus.FAILED: "failed",
}
_TEARDOWN_WORD = {
    WorkflowExecutionStatus.RUNNING: "deleting",
    WorkflowExecutionStatus.COMPLETED: "deleted",
}


async def list_clusters(client: Client) -> list[ClusterRow]:
    """One row per cluster (its latest provisioning), newest first."""
    teardowns: dict[str, tuple[datetime, WorkflowExecutionStatus | None]] = {}
    async for wf in client.list_workflows(_TEARDOWNS):
        if wf.id not in teardowns:  # newest first: the first seen is the latest
            teardowns[wf.id] = (wf.start_time, wf.status)
    rows: dict[str, ClusterRow] = {}
    async for wf in client.list_workflows(_PROVISIONINGS):
        if wf.id in rows:
            continue
        name = wf.id.removeprefix(provisioning_workflow_id(""))
        memo = await wf.memo()
        status = _STATUS_WORD.get(wf.status) if wf.status else None
        status = status or (wf.status.name.lower() if wf.status else "unknown")
        down = teardowns.get(ops_workflow_id(name))
        if wf.status == WorkflowExecutionStatus.COMPLETED and down and down[0] >= wf.start_time:
            status = _TEARDOWN_WORD.get(down[1], "teardown failed") if down[1] else status
        rows[wf.id] = ClusterRow(
            name=name,
            provider=str(memo.get("provider", "?")),
            location=str(memo.get("location", "?")),
            status=status,
            started_at=wf.start_time,
            workflow_id=wf.id,
        )
    return sorted(rows.values(), key=lambda r: r.started_at, reverse=True)
