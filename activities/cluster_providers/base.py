"""What a cluster provider does, as the `cluster_*` activities call it (activities/
cluster_provider.py; the activity names are in activities/contracts.py).

An implementation serves one way of making a cluster (Managed Slurm, Slinky on CMK). Every
operation is idempotent (a retry adopts what a lost attempt made), heartbeats while it waits
and fails as an ApplicationError the workflow can read; a provider adds nothing else to the
contract.
"""

from __future__ import annotations

from typing import Protocol

from autoclusters.core.cluster import (
    AcceptanceCall,
    AcceptanceResult,
    BootResult,
    ClusterRef,
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
from autoclusters.core.cluster_ops import Inventory
from autoclusters.core.models import HealthReport

# The Crusoe VM states both providers' machines end a boot in.
VM_BOOTED = frozenset({"RUNNING"})
VM_FAILED = frozenset({"FAILED", "CRASHED"})


class ClusterProvider(Protocol):
    """One provider's side of provisioning, scaling and teardown."""

    # The cluster's parts.
    async def create_controller(self, call: ProviderCall) -> Resource: ...
    async def create_accounting(self, call: ProviderCall) -> Resource: ...
    async def create_shared_home(self, call: ProviderCall) -> Resource: ...
    async def create_login_nodes(self, call: ProviderCall) -> Resource: ...

    # Machines.
    async def create_machine(self, call: MachineCall) -> Machine: ...
    async def wait_booted(self, machine: Machine) -> BootResult: ...
    async def discover_topology(self, call: TopologyCall) -> list[Placement]: ...

    # Slurm.
    async def configure_slurm(self, call: SlurmConfigCall) -> SlurmConfigResult: ...
    async def health_gate(self, call: NodeGateCall) -> HealthReport: ...
    async def acceptance_job(self, call: AcceptanceCall) -> AcceptanceResult: ...
    async def add_users(self, call: UsersCall) -> UsersResult: ...

    # Deleting and listing.
    async def delete(self, call: DeleteCall) -> None: ...
    async def inventory(self, cluster: ClusterRef) -> Inventory: ...
