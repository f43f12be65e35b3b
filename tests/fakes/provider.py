"""An in-memory cluster provider: the `cluster_*` activities ClusterProvisioning calls.

Every call is appended to `calls` (`create_controller`, `create_machine gpu-01#1`,
`boot gpu-01#1`, ...), so a test reads the order of steps; `alive` is what exists (and
would be billed) now. Failures are scripted: a node's first N machines fail to boot or
fail their gate, the N+1-th machine creation is refused for quota, a node set's acceptance
job fails.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from autoclusters.core.cluster import (
    BOOT_FAILED,
    QUOTA_EXCEEDED,
    AcceptanceCall,
    AcceptanceResult,
    BootResult,
    DeleteCall,
    Machine,
    MachineCall,
    NodeGateCall,
    Placement,
    ProviderCall,
    Resource,
    SlurmConfigCall,
    SlurmConfigResult,
    TopologyCall,
    UsersCall,
    UsersResult,
)
from autoclusters.core.evidence import EvidenceAck
from autoclusters.core.guard import GuardContext
from autoclusters.core.models import HealthCheck, HealthReport
from tests.fakes.systems import agent_snapshot

QUOTA_MESSAGE = "quota exceeded: project allows 3 h100-80gb-sxm-ib.8x instances, 4 requested"


class FakeProvider:
    def __init__(
        self,
        *,
        boot_failures: dict[str, int] | None = None,
        gate_failures: dict[str, int] | None = None,
        machines_allowed: int | None = None,
        failing_acceptance: set[str] | None = None,
        boot_errors: dict[str, int] | None = None,
        unregistered: dict[str, int] | None = None,
        leaf_size: int = 2,
        leaves_per_pod: int = 2,
    ) -> None:
        self.boot_failures = dict(boot_failures or {})
        self.gate_failures = dict(gate_failures or {})
        self.machines_allowed = machines_allowed
        self.failing_acceptance = failing_acceptance or set()
        # The first N machines of a node: the provider raises BootFailed / slurmd never registers.
        self.boot_errors = dict(boot_errors or {})
        self.unregistered = dict(unregistered or {})
        self.leaf_size, self.leaves_per_pod = leaf_size, leaves_per_pod
        self.calls: list[str] = []
        self.alive: dict[str, Resource] = {}
        self.deleted: list[Resource] = []
        self.topology_conf: str | None = None
        self.machines_created = 0
        self.guard_contexts: list[GuardContext] = []  # for a test's guard_attach_policy
        self._lock = asyncio.Lock()

    def activities(self) -> list[Any]:
        return [
            self.create_controller,
            self.create_accounting,
            self.create_shared_home,
            self.create_login_nodes,
            self.create_machine,
            self.wait_booted,
            self.discover_topology,
            self.configure_slurm,
            self.health_gate,
            self.acceptance_job,
            self.add_users,
            self.delete,
        ]

    def _made(self, kind: Any, name: str) -> Resource:
        res = Resource(kind=kind, id=f"{kind}-{len(self.alive) + len(self.deleted) + 1}", name=name)
        self.alive[res.id] = res
        self.calls.append(f"create_{kind}")
        return res

    @activity.defn(name="cluster_create_controller")
    async def create_controller(self, call: ProviderCall) -> Resource:
        return self._made("controller", f"{call.cluster.name}-controller-0")

    @activity.defn(name="cluster_create_accounting")
    async def create_accounting(self, call: ProviderCall) -> Resource:
        assert call.controller is not None
        return self._made("accounting", f"{call.cluster.name}-accounting-0")

    @activity.defn(name="cluster_create_shared_home")
    async def create_shared_home(self, call: ProviderCall) -> Resource:
        return self._made("shared_home", f"{call.cluster.name}-home-{call.spec.shared_home.size}Gi")

    @activity.defn(name="cluster_create_login_nodes")
    async def create_login_nodes(self, call: ProviderCall) -> Resource:
        return self._made("login", f"{call.cluster.name}-login")

    @activity.defn(name="cluster_create_machine")
    async def create_machine(self, call: MachineCall) -> Machine:
        async with self._lock:
            if self.machines_allowed is not None and self.machines_created >= self.machines_allowed:
                self.calls.append(f"refused {call.node}#{call.attempt}")
                raise ApplicationError(QUOTA_MESSAGE, type=QUOTA_EXCEEDED, non_retryable=True)
            self.machines_created += 1
            vm = f"vm-{call.node}-{call.attempt}"
            self.alive[vm] = Resource(kind="machine", id=vm, name=call.node)
            self.calls.append(f"create_machine {call.node}#{call.attempt}")
        return Machine(
            cluster=call.cluster,
            node_set=call.node_set.name,
            node=call.node,
            machine_id=vm,
            attempt=call.attempt,
        )

    @activity.defn(name="cluster_wait_booted")
    async def wait_booted(self, machine: Machine) -> BootResult:
        self.calls.append(f"boot {machine.node}#{machine.attempt}")
        if self.boot_failures.get(machine.node, 0) >= machine.attempt:
            return BootResult(booted=False, detail="kernel panic on boot")
        if self.boot_errors.get(machine.node, 0) >= machine.attempt:
            raise ApplicationError("VM entered STATE_FAILED", type=BOOT_FAILED, non_retryable=True)
        return BootResult(booted=True)

    @activity.defn(name="cluster_discover_topology")
    async def discover_topology(self, call: TopologyCall) -> list[Placement]:
        self.calls.append("discover_topology")
        out = []
        for i, m in enumerate(sorted(call.machines, key=lambda m: m.node)):
            leaf = i // self.leaf_size
            out.append(
                Placement(
                    node=m.node, leaf=f"leaf-{leaf}", pod=f"pod-{leaf // self.leaves_per_pod}"
                )
            )
        return out

    @activity.defn(name="cluster_configure_slurm")
    async def configure_slurm(self, call: SlurmConfigCall) -> SlurmConfigResult:
        self.calls.append("configure_slurm")
        self.topology_conf = call.topology_conf
        return SlurmConfigResult(
            registered=[
                m.node for m in call.machines if self.unregistered.get(m.node, 0) < m.attempt
            ]
        )

    @activity.defn(name="cluster_health_gate")
    async def health_gate(self, call: NodeGateCall) -> HealthReport:
        m = call.machine
        self.calls.append(f"gate {m.node}#{m.attempt}")
        ok = self.gate_failures.get(m.node, 0) < m.attempt
        return HealthReport(
            node=m.node,
            passed=ok,
            checks=[HealthCheck(name="gpus", passed=ok, detail="" if ok else "7 of 8 GPUs")],
            expected_gpus=call.expected_gpus,
        )

    @activity.defn(name="cluster_acceptance_job")
    async def acceptance_job(self, call: AcceptanceCall) -> AcceptanceResult:
        ns = call.node_set
        self.calls.append(f"acceptance {ns.name}")
        ok = ns.name not in self.failing_acceptance
        return AcceptanceResult(
            node_set=ns.name,
            passed=ok,
            detail="all-reduce 412 GB/s" if ok else "NCCL all-reduce hung",
            job_id=1000 + len(self.calls),
            nodes=ns.nodes,
        )

    @activity.defn(name="cluster_add_users")
    async def add_users(self, call: UsersCall) -> UsersResult:
        self.calls.append("add_users")
        return UsersResult(added=[u.name for u in call.users])

    @activity.defn(name="cluster_delete")
    async def delete(self, call: DeleteCall) -> None:
        res = self.alive.pop(call.resource.id, None)
        self.calls.append(f"delete {call.resource.kind} {call.resource.id}")
        if res is not None:  # idempotent: a retried delete of a deleted thing is fine
            self.deleted.append(res)


async def feed_agents(
    env: WorkflowEnvironment,
    handle: WorkflowHandle[Any, Any],
    faulty_first: frozenset[str] = frozenset(),
    nodes: tuple[str, ...] = ("gpu-01", "gpu-02", "gpu-03", "gpu-04"),
) -> dict[str, int]:
    """Stand in for the API and the node agents: give every node whose gate waits a
    snapshot from its agent (the first from a node in `faulty_first` shows an XID 79);
    return how many each node's gates took. Ends when the workflow does."""
    taken: dict[str, int] = {}
    while (await handle.describe()).status == WorkflowExecutionStatus.RUNNING:
        now = await env.get_current_time()
        for node in nodes:
            n = taken.get(node, 0)
            faults = {"XID_79": now} if node in faulty_first and n == 0 else None
            snap = agent_snapshot(node, observed_at=now, boot_id=f"b{n}", faults=faults)
            if await handle.query("wants_evidence", snap, result_type=bool):
                ack = await handle.execute_update("health_evidence", snap, result_type=EvidenceAck)
                assert ack.kept
                taken[node] = n + 1
        await asyncio.sleep(0.2)  # the agents' report interval, in real time
    return taken
