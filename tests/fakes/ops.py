"""A provisioned cluster in memory for ScaleNodeSet and ClusterTeardown: the provider
(tests/fakes/provider.py, grown an inventory) wired to a FakeSlurm, so configure_slurm adds
nodes to Slurm (drained when asked) and a deleted machine's node leaves it. The Slurm steps
are the real SlurmActivities over that FakeSlurm (drain, requeue with its markers, wait for
idle, return to service).

`gated_drained`: per gate call, whether the node was drained (out of the scheduler's reach)
while it was gated; `busy_at_delete`: the jobs a node ran when its machine was deleted.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from autoclusters.core.cluster import (
    ClusterRef,
    DeleteCall,
    Machine,
    MachineCall,
    NodeGateCall,
    Resource,
    SlurmConfigCall,
    SlurmConfigResult,
)
from autoclusters.core.cluster_ops import Inventory
from autoclusters.core.cluster_spec import ClusterSpec
from autoclusters.core.models import HealthReport
from tests.fakes.provider import FakeProvider
from tests.fakes.systems import FakeSlurm

_ACTIVE = {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "PENDING"}


class OpsProvider(FakeProvider):
    def __init__(self, slurm: FakeSlurm, **kw: Any) -> None:
        super().__init__(**kw)
        self.slurm = slurm
        self.machines: dict[str, Machine] = {}
        self.gated_drained: dict[str, bool] = {}
        self.busy_at_delete: dict[str, list[int]] = {}
        # Deletes that happen and then report a transient error (a crash after the side
        # effect): the retried call finds the resource gone.
        self.fail_after_delete: set[str] = set()

    def seed(self, spec: ClusterSpec) -> ClusterRef:
        """The cluster as ClusterProvisioning left it: every resource, every node in Slurm."""
        ref = ClusterRef(name=spec.name, provider=spec.provider, location=spec.location)
        self._made("controller", f"{spec.name}-controller-0")
        if spec.accounting:
            self._made("accounting", f"{spec.name}-accounting-0")
        self._made("shared_home", f"{spec.name}-home")
        self._made("login", f"{spec.name}-login")
        for s in spec.node_sets:
            for node in s.node_names():
                vm = f"vm-{node}-1"
                self.alive[vm] = Resource(kind="machine", id=vm, name=node)
                self.machines[vm] = Machine(
                    cluster=ref, node_set=s.name, node=node, machine_id=vm, attempt=1
                )
                self.slurm.add_node(node)
        self.calls.clear()
        return ref

    def activities(self) -> list[Any]:
        return [*super().activities(), self.inventory]

    @activity.defn(name="cluster_inventory")
    async def inventory(self, cluster: ClusterRef) -> Inventory:
        self.calls.append("inventory")
        return Inventory(
            resources=list(self.alive.values()),
            machines=[self.machines[vm] for vm in self.alive if vm in self.machines],
        )

    @activity.defn(name="cluster_create_machine")
    async def create_machine(self, call: MachineCall) -> Machine:
        machine = await FakeProvider.create_machine(self, call)
        self.machines[machine.machine_id] = machine
        return machine

    @activity.defn(name="cluster_configure_slurm")
    async def configure_slurm(self, call: SlurmConfigCall) -> SlurmConfigResult:
        result = await FakeProvider.configure_slurm(self, call)
        wanted = {m.node for m in call.machines}
        for node in result.registered:
            if await self.slurm.node(node) is None:
                reason = call.drained.get(node, "")
                self.slurm.add_node(node, state_flags=["DRAIN"] if reason else [], reason=reason)
        for n in await self.slurm.nodes():
            if n.name not in wanted:
                self.slurm._nodes.pop(n.name)  # slurm.conf no longer lists it
        return result

    @activity.defn(name="cluster_health_gate")
    async def health_gate(self, call: NodeGateCall) -> HealthReport:
        node = await self.slurm.node(call.machine.node)
        self.gated_drained[f"{call.machine.node}#{call.machine.attempt}"] = bool(
            node and node.drained
        )
        return await FakeProvider.health_gate(self, call)

    @activity.defn(name="cluster_delete")
    async def delete(self, call: DeleteCall) -> None:
        if call.resource.kind == "machine":
            jobs = await self.slurm.jobs_on_node(call.resource.name)
            self.busy_at_delete[call.resource.name] = [
                j.job_id for j in jobs if j.job_state in _ACTIVE and j.nodes
            ]
        await FakeProvider.delete(self, call)
        if call.resource.kind in self.fail_after_delete:
            self.fail_after_delete.discard(call.resource.kind)
            raise RuntimeError(f"connection reset after deleting {call.resource.id}")
