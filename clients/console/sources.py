"""Where the console reads the cluster from: Temporal (incidents, the fleet guard, the
provisioning workflow), Slurm (sinfo) and Kubernetes. Read-only: nothing here signals,
updates or starts a workflow.

`ConsoleSource` is what the pages need; `LiveSource` answers it from the real systems and
tests hand the routes a fake. Every call is bounded (`timeout_s`): a page shows what it
could read and names what it could not, it never hangs on one slow system.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, Protocol

from pydantic import BaseModel
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients import incidents, systemic_incidents
from autoclusters.clients.incident_history import LADDER_HISTORY, ladder_at_open
from autoclusters.clients.incidents import IncidentNotFound, IncidentSummary
from autoclusters.clients.systemic_incidents import SystemicRead
from autoclusters.core.cluster import ClusterState, provisioning_workflow_id
from autoclusters.core.guard import GuardStatus, guard_workflow_id
from autoclusters.core.ladder_figures import LadderFigures
from autoclusters.core.models import IncidentState, SlurmNode
from autoclusters.core.settings import Settings
from autoclusters.core.systemic import SystemicState
from autoclusters.integrations.slurm import SlurmClient
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning
from autoclusters.workflows.fleet_guard import FleetGuard
from autoclusters.workflows.remediation import NodeRemediation


class IncidentRead(BaseModel):
    state: IncidentState
    workflow_id: str
    temporal_status: str


class ConsoleSource(Protocol):
    async def slurm_nodes(self) -> list[SlurmNode]: ...

    async def cluster(self) -> ClusterState | None:
        """The provisioning workflow's state (None: this cluster was not provisioned by us)."""
        ...

    async def guard(self) -> GuardStatus | None:
        """The fleet guard's status (None: no guard has run for this cluster)."""
        ...

    async def open_incidents(self) -> list[IncidentState]: ...

    async def incidents(
        self, *, node: str | None, state: str | None, limit: int
    ) -> list[IncidentSummary]: ...

    async def incident(self, incident_id: str) -> IncidentRead:
        """IncidentNotFound: none; SystemicIncidentFound: the id is a systemic incident's."""
        ...

    async def systemic_incidents(self) -> list[SystemicState]:
        """The open systemic incidents (docs/systemic.md), newest first."""
        ...

    async def systemic(self, incident_id: str) -> SystemicRead:
        """One systemic incident; IncidentNotFound: none (or it is a node's incident)."""
        ...

    async def recent_states(self, limit: int) -> list[IncidentState]: ...

    async def kubernetes_node(self, node: str) -> dict[str, str] | None:
        """The Kubernetes Node's state (None: the cluster runs no Kubernetes)."""
        ...

    async def ladder(self) -> LadderFigures:
        """How each rung has fared per fault kind, from the incidents' histories: the
        figures the next incident opens with. Raises when they cannot be read."""
        ...


ClientGetter = Callable[[], Awaitable[Client]]
QUERY_TIMEOUT = timedelta(seconds=5)


class LiveSource:
    def __init__(
        self, settings: Settings, client: ClientGetter, slurm: SlurmClient, *, timeout_s: float
    ) -> None:
        self._settings = settings
        self._client = client
        self._slurm = slurm
        self._timeout_s = timeout_s
        # A closed incident never changes: its state is read once (the feed reads many).
        self._closed: OrderedDict[str, IncidentState] = OrderedDict()

    async def _bounded(self, call: Awaitable[Any]) -> Any:
        return await asyncio.wait_for(call, self._timeout_s)

    async def slurm_nodes(self) -> list[SlurmNode]:
        nodes: list[SlurmNode] = await self._bounded(self._slurm.nodes())
        return nodes

    async def cluster(self) -> ClusterState | None:
        client = await self._client()
        handle = client.get_workflow_handle(provisioning_workflow_id(self._settings.cluster))
        try:
            state: ClusterState = await self._bounded(
                handle.query(ClusterProvisioning.status, rpc_timeout=QUERY_TIMEOUT)
            )
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return state

    async def guard(self) -> GuardStatus | None:
        client = await self._client()
        handle = client.get_workflow_handle(guard_workflow_id(self._settings.cluster))
        try:
            status: GuardStatus = await self._bounded(
                handle.query(FleetGuard.status, rpc_timeout=QUERY_TIMEOUT)
            )
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return status

    async def open_incidents(self) -> list[IncidentState]:
        client = await self._client()
        query = (
            "WorkflowType = 'NodeRemediation' AND ExecutionStatus = 'Running' AND Cluster = "
            + _quoted(self._settings.cluster)
        )

        async def read(wf_id: str, run_id: str | None) -> IncidentState | None:
            handle = client.get_workflow_handle(wf_id, run_id=run_id)
            try:
                state: IncidentState = await handle.query(
                    NodeRemediation.status, rpc_timeout=QUERY_TIMEOUT
                )
            except RPCError:  # it closed meanwhile, or no worker answered: next poll
                return None
            return state

        async def all_open() -> list[IncidentState]:
            found = [read(wf.id, wf.run_id) async for wf in client.list_workflows(query)]
            return [s for s in await asyncio.gather(*found) if s is not None]

        result: list[IncidentState] = await self._bounded(all_open())
        return result

    async def incidents(
        self, *, node: str | None, state: str | None, limit: int
    ) -> list[IncidentSummary]:
        client = await self._client()
        found: list[IncidentSummary] = await self._bounded(
            incidents.list_incidents(client, self._settings, state, node, None, limit=limit)
        )
        return found

    async def incident(self, incident_id: str) -> IncidentRead:
        client = await self._client()

        async def read() -> IncidentRead:
            handle = await incidents.find_incident(client, self._settings, incident_id)
            state, status = await incidents.incident_state(handle)  # a systemic one raises
            assert state is not None
            return IncidentRead(state=state, workflow_id=handle.id, temporal_status=status)

        got: IncidentRead = await self._bounded(read())
        return got

    async def systemic_incidents(self) -> list[SystemicState]:
        client = await self._client()
        found: list[SystemicState] = await self._bounded(
            systemic_incidents.open_systemic(client, self._settings)
        )
        return found

    async def systemic(self, incident_id: str) -> SystemicRead:
        client = await self._client()

        async def read() -> SystemicRead:
            handle = await incidents.find_incident(client, self._settings, incident_id)
            got = await systemic_incidents.systemic_read(handle)
            if got is None:
                raise IncidentNotFound(f"{incident_id} is a node's incident, not a systemic one")
            return got

        got: SystemicRead = await self._bounded(read())
        return got

    async def recent_states(self, limit: int) -> list[IncidentState]:
        client = await self._client()
        rows = await self.incidents(node=None, state=None, limit=limit)

        async def read(row: IncidentSummary) -> IncidentState | None:
            if row.incident_id in self._closed:
                return self._closed[row.incident_id]
            handle = client.get_workflow_handle(row.workflow_id)
            try:
                state: IncidentState = await handle.query(
                    NodeRemediation.status, rpc_timeout=QUERY_TIMEOUT
                )
            except RPCError:
                return None
            if row.status != "running" and state.request.incident_id == row.incident_id:
                self._closed[row.incident_id] = state
                while len(self._closed) > 1000:
                    self._closed.popitem(last=False)
            return state

        states: list[IncidentState | None] = await self._bounded(
            asyncio.gather(*(read(r) for r in rows))
        )
        return [s for s in states if s is not None]

    async def ladder(self) -> LadderFigures:
        # The runbook's own reader: one read of the histories serves the console and the
        # incidents that open meanwhile, and the page shows the figures they open with.
        reader = ladder_at_open(await self._client())
        try:
            return await reader.figures(self._settings.cluster)
        except TimeoutError:
            # The read goes on (shielded) and serves the next view.
            raise TimeoutError(
                f"still reading the incidents' histories (the last {LADDER_HISTORY.days} "
                "days); they show on a later view"
            ) from None

    async def kubernetes_node(self, node: str) -> dict[str, str] | None:
        if self._settings.kubernetes.kubeconfig is None:
            return None
        return await self._bounded(asyncio.to_thread(_read_k8s_node, self._settings, node))


def _read_k8s_node(settings: Settings, node: str) -> dict[str, str]:
    """The Node's state; a refusal (404, 403) is what the page shows. The API not answering
    (429/5xx, no connection, a timeout) raises `KubernetesUnavailable`: the page says the
    API is unavailable and shows the node's Kubernetes state as unknown, not absent."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    from autoclusters.activities.kubernetes import kubernetes_outage
    from autoclusters.integrations.k8s import api_client

    with api_client(kubeconfig=settings.kubernetes.kubeconfig) as api:
        try:
            obj = k8s.CoreV1Api(api).read_node(node, _request_timeout=5)
        except Exception as e:
            outage = kubernetes_outage(e)
            if outage is not None:
                raise outage from e
            if isinstance(e, ApiException):
                return {"error": f"{e.status} {e.reason}"}
            raise
    status, spec = obj.status, obj.spec
    conditions = (status.conditions if status else None) or []
    ready = next((c for c in conditions if c.type == "Ready"), None)
    taints = ", ".join(
        f"{t.key}={t.value or ''}:{t.effect}" for t in ((spec.taints if spec else None) or [])
    )
    return {
        "ready": f"{ready.status} ({ready.reason or ''})" if ready else "unknown",
        "schedulable": "no (cordoned)" if spec and spec.unschedulable else "yes",
        "taints": taints or "none",
    }


def _quoted(value: str) -> str:
    # One string literal of a visibility query, whatever the cluster is called.
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
