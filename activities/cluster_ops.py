"""Activities of scaling and teardown that are not the provider's: how busy each node is
(Slurm) and whether a node has a remediation incident open (Temporal).

`cluster_inventory` is the provider's (it comes with the providers, issue 12).
"""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.cluster_ops import IncidentProbe, NodeLoad, NodeLoadCall, WorkflowProbe
from autoclusters.core.models import workflow_id
from autoclusters.integrations.slurm import SlurmClient

_BUSY = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED"}


class ClusterOpsActivities:
    def __init__(self, client: Client, slurm: SlurmClient) -> None:
        self._client = client
        self._slurm = slurm

    @activity.defn(name="cluster_node_load")
    async def node_load(self, call: NodeLoadCall) -> list[NodeLoad]:
        wanted = set(call.nodes)
        out = {
            n.name: NodeLoad(node=n.name, state=n.state, drained=n.drained, reason=n.reason)
            for n in await self._slurm.nodes()
            if n.name in wanted
        }
        for name, load in out.items():
            load.jobs = sorted(
                j.job_id for j in await self._slurm.jobs_on_node(name) if j.job_state in _BUSY
            )
        return [out[n] for n in call.nodes if n in out]

    @activity.defn(name="cluster_incident_open")
    async def incident_open(self, probe: IncidentProbe) -> bool:
        return await self._running(workflow_id(probe.cluster, probe.node))

    @activity.defn(name="cluster_workflow_running")
    async def workflow_running(self, probe: WorkflowProbe) -> bool:
        return await self._running(probe.workflow_id)

    async def _running(self, wf_id: str) -> bool:
        handle = self._client.get_workflow_handle(wf_id)
        try:
            desc = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status == WorkflowExecutionStatus.RUNNING
