"""The fleet guard, as seen from an incident: register, admit quarantine/repair, release.

A workflow cannot send an update to another workflow, so the incident asks its cluster's
guard through these activities. Each call is an update-with-start: the first incident of a
cluster starts its guard, every later one reaches the guard already running. A registration
carries the incident's guard policy, topology and approvers (the guard adopts the newest),
and registrations and admissions carry Slurm's view (the cluster's size, the nodes out of
service), on which the guard reconciles its count. `guard_slurm_view` is the guard's own:
it re-reads Slurm now and then while incidents wait.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Literal

from temporalio import activity
from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError

from autoclusters.activities.guard_batch import GuardBatcher
from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.systemic import SystemicActivities
from autoclusters.core.guard import (
    GUARD_WORKFLOW,
    Admission,
    AdmitCall,
    AdmitRequest,
    GuardContext,
    GuardStatus,
    PolicyUpdate,
    RegisterCall,
    Registration,
    ReleaseCall,
    SlurmView,
    SlurmViewCall,
    SpareCall,
    SpareClaim,
    guard_workflow_id,
)
from autoclusters.core.guard_batch import GuardAnswer, GuardCall
from autoclusters.core.sharing import is_sharing_reason
from autoclusters.integrations.slurm import SlurmClient


class GuardActivities:
    def __init__(
        self,
        client: Client,
        slurm: SlurmClient,
        task_queue: str,
        *,
        execution_timeout: timedelta | None = None,
    ) -> None:
        """`task_queue`: where a guard started here runs. `execution_timeout`: for tests
        only — a guard normally runs for as long as its cluster does."""
        self._client = client
        self._slurm = slurm
        self._task_queue = task_queue
        self._execution_timeout = execution_timeout
        # register, admissions and releases of this worker's activities go out together.
        self._batcher = GuardBatcher(self._send)
        self._reading: dict[str, asyncio.Future[SlurmView]] = {}  # cluster -> read in flight

    def _start(self, guard: GuardContext) -> WithStartWorkflowOperation[Any, Any]:
        # A fresh operation per call: one cannot be reused.
        return WithStartWorkflowOperation(
            GUARD_WORKFLOW,
            guard.guard_input(),
            id=guard_workflow_id(guard.cluster),
            task_queue=self._task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            execution_timeout=self._execution_timeout,
        )

    async def _send(self, guard: GuardContext, update: str, arg: Any, result: type) -> Any:
        # By name: the workflow is the layer above, this module does not import it.
        return await self._client.execute_update_with_start_workflow(
            update, arg, start_workflow_operation=self._start(guard), result_type=result
        )

    async def _batched(self, guard: GuardContext, call: GuardCall) -> GuardAnswer:
        async with heartbeating(f"fleet guard {call.update}"):
            try:
                answer = await self._batcher.call(guard, call)
            except WorkflowUpdateFailedError as e:
                answer = GuardAnswer(refused=str(e.cause or e))
        if answer.refused is not None:
            # The guard rejected the request as malformed: asking again cannot help.
            raise ApplicationError(
                f"fleet guard of {guard.cluster} refused {activity.info().activity_type}: "
                f"{answer.refused}",
                type="GuardRejected",
                non_retryable=True,
            )
        return answer

    async def _update(self, guard: GuardContext, update: str, arg: Any, result: type) -> Any:
        try:
            async with heartbeating(f"fleet guard {update}"):
                return await self._send(guard, update, arg, result)
        except WorkflowUpdateFailedError as e:
            # The guard rejected the request as malformed: asking again cannot help.
            raise ApplicationError(
                f"fleet guard of {guard.cluster} refused {activity.info().activity_type}: "
                f"{e.cause or e}",
                type="GuardRejected",
                non_retryable=True,
            ) from e

    def systemic(self) -> SystemicActivities:
        """The systemic incidents' activities, on the same client and task queue."""
        return SystemicActivities(
            self._client, self._task_queue, execution_timeout=self._execution_timeout
        )

    @activity.defn(name="guard_register")
    async def register(self, call: RegisterCall) -> Registration:
        g = call.guard
        opened = call.incident.model_copy(
            update={
                "policy": call.incident.policy or g.policy,
                "topology": call.incident.topology
                if call.incident.topology is not None
                else g.topology,
                "approvers": call.incident.approvers
                if call.incident.approvers is not None
                else g.approvers,
                "slurm": call.incident.slurm or await self._view(g.cluster),
            }
        )
        answer = await self._batched(g, GuardCall(update="register", opened=opened))
        assert answer.registration is not None
        return answer.registration

    @activity.defn(name="guard_admit_quarantine")
    async def admit_quarantine(self, call: AdmitCall) -> Admission:
        return await self._admit(call, "admit_quarantine")

    @activity.defn(name="guard_admit_repair")
    async def admit_repair(self, call: AdmitCall) -> Admission:
        return await self._admit(call, "admit_repair")

    @activity.defn(name="guard_admit_held_drain")
    async def admit_held_drain(self, call: AdmitCall) -> Admission:
        """May the node be drained while its quarantine is held? (the guard's floor)"""
        return await self._admit(call, "admit_held_drain")

    async def _admit(
        self,
        call: AdmitCall,
        update: Literal["admit_quarantine", "admit_repair", "admit_held_drain"],
    ) -> Admission:
        req = await self._admit_request(call)
        answer = await self._batched(call.guard, GuardCall(update=update, admit=req))
        assert answer.admission is not None
        return answer.admission

    @activity.defn(name="guard_claim_spare")
    async def claim_spare(self, call: SpareCall) -> SpareClaim:
        result: SpareClaim = await self._update(call.guard, "claim_spare", call.request, SpareClaim)
        return result

    @activity.defn(name="guard_refill_spare")
    async def refill_spare(self, call: SpareCall) -> list[str]:
        result: list[str] = await self._update(call.guard, "refill_spare", call.request, list[str])
        return result

    @activity.defn(name="guard_release")
    async def release(self, call: ReleaseCall) -> None:
        await self._batched(call.guard, GuardCall(update="release", release=call.release))

    @activity.defn(name="guard_attach_policy")
    async def attach_policy(self, guard: GuardContext) -> GuardStatus:
        """Start the cluster's guard if it is not running (a cluster just provisioned) and
        give it the cluster's guard policy, topology and approvers."""
        upd = PolicyUpdate(policy=guard.policy, topology=guard.topology, approvers=guard.approvers)
        result: GuardStatus = await self._update(guard, "update_policy", upd, GuardStatus)
        return result

    @activity.defn(name="guard_slurm_view")
    async def slurm_view(self, call: SlurmViewCall) -> SlurmView:
        return await self._view(call.cluster)

    async def _view(self, cluster: str) -> SlurmView:
        """Slurm's view; calls that come while a read is in flight share it (at a thousand
        concurrent incidents, one `sinfo` per guard call is thousands of them)."""
        reading = self._reading.get(cluster)
        if reading is None or reading.done():
            reading = self._reading[cluster] = asyncio.ensure_future(self._read_view())
        async with heartbeating(f"reading the nodes of {cluster}"):
            # Shielded: one cancelled activity does not cancel the others' read.
            return await asyncio.shield(reading)

    async def _read_view(self) -> SlurmView:
        nodes = await self._slurm.nodes()
        # A node lent to inference (or moving) is drained in Slurm but serving: it is
        # capacity in use, not capacity lost, so it does not count against the guard.
        return SlurmView(
            cluster_nodes=len(nodes),
            out_of_service=sorted(
                n.name
                for n in nodes
                if not n.responding or (n.drained and not is_sharing_reason(n.reason))
            ),
        )

    async def _admit_request(self, call: AdmitCall) -> AdmitRequest:
        view = await self._view(call.guard.cluster)
        return AdmitRequest(
            node=call.node,
            incident_id=call.incident_id,
            cluster_nodes=view.cluster_nodes,
            workflow_id=call.workflow_id,
            out_of_service=view.out_of_service,
        )
