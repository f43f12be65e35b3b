"""The `cluster_*` activities (names as in activities/contracts.py): each hands its call to
the provider of the call's cluster (activities/cluster_providers/: Managed Slurm for
providers `sandbox` and `crusoe-managed-slurm`; Slinky on CMK for `crusoe-cmk` when the
worker has a kubeconfig and a CMK cluster id), chosen once by registry.py. A provider this
worker does not serve is refused as ProviderUnavailable.

Every activity is idempotent (a retry adopts what a lost attempt made), heartbeats while
it waits, and turns provider errors into ApplicationErrors: quota -> QuotaExceeded,
capacity -> CapacityUnavailable (both non-retryable, with the provider's message), any
other refusal (4xx) non-retryable, the rest retryable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import activity

from autoclusters.activities.cluster_providers.base import ClusterProvider
from autoclusters.activities.cluster_providers.registry import worker_providers
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
from autoclusters.integrations.crusoe.client import CrusoeClient
from autoclusters.integrations.slurm import SlurmBatchClient


class ClusterProviderActivities:
    """The provider activities, registered by the worker.

    Args:
        crusoe: the project's Crusoe client (its endpoint: Crusoe, or the emulator).
        slurm: the cluster's Slurm.
        poll_s: how often a wait polls the API or Slurm.
        register_timeout_s: how long `configure_slurm` waits for nodes to register; a node
            still missing then is left out of `registered` (the workflow replaces it).
        acceptance_timeout_s: the longest an acceptance job may take before it is cancelled
            and counted failed.
        cmk: provider crusoe-cmk's implementation (activities/cluster_providers/cmk.py),
            when the worker has a kubeconfig and a CMK cluster id; without it crusoe-cmk is
            refused.
    """

    def __init__(
        self,
        crusoe: CrusoeClient,
        slurm: SlurmBatchClient,
        *,
        poll_s: float = 2.0,
        register_timeout_s: float = 300.0,
        acceptance_timeout_s: float = 1200.0,
        cmk: ClusterProvider | None = None,
    ) -> None:
        self._cmk = cmk  # what the worker configured for crusoe-cmk (its test reads it)
        self._providers = worker_providers(
            crusoe,
            slurm,
            poll_s=poll_s,
            register_timeout_s=register_timeout_s,
            acceptance_timeout_s=acceptance_timeout_s,
            cmk=cmk,
        )

    def activities(self) -> list[Callable[..., Awaitable[Any]]]:
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
            self.inventory,
        ]

    # --- the cluster: controller, accounting, shared home, login ------------------------

    @activity.defn(name="cluster_create_controller")
    async def create_controller(self, call: ProviderCall) -> Resource:
        """Create the cluster's controller (or adopt the one with the spec's name)."""
        return await self._providers.serving(call.cluster).create_controller(call)

    @activity.defn(name="cluster_create_accounting")
    async def create_accounting(self, call: ProviderCall) -> Resource:
        """The cluster's accounting (slurmdbd)."""
        return await self._providers.serving(call.cluster).create_accounting(call)

    @activity.defn(name="cluster_create_shared_home")
    async def create_shared_home(self, call: ProviderCall) -> Resource:
        """The cluster's shared /home."""
        return await self._providers.serving(call.cluster).create_shared_home(call)

    @activity.defn(name="cluster_create_login_nodes")
    async def create_login_nodes(self, call: ProviderCall) -> Resource:
        """The cluster's login nodes."""
        return await self._providers.serving(call.cluster).create_login_nodes(call)

    # --- machines -----------------------------------------------------------------------

    @activity.defn(name="cluster_create_machine")
    async def create_machine(self, call: MachineCall) -> Machine:
        """A machine for the node's slot (a retry adopts this attempt's machine)."""
        return await self._providers.serving(call.cluster).create_machine(call)

    @activity.defn(name="cluster_wait_booted")
    async def wait_booted(self, machine: Machine) -> BootResult:
        """Until the machine boots or fails (with the provider's reason)."""
        return await self._providers.serving(machine.cluster).wait_booted(machine)

    @activity.defn(name="cluster_discover_topology")
    async def discover_topology(self, call: TopologyCall) -> list[Placement]:
        """Each machine's pod and leaf in the fabric; unknown: unplaced."""
        return await self._providers.serving(call.cluster).discover_topology(call)

    # --- Slurm ----------------------------------------------------------------------------

    @activity.defn(name="cluster_configure_slurm")
    async def configure_slurm(self, call: SlurmConfigCall) -> SlurmConfigResult:
        """Write the node layout, then wait, bounded, for the nodes to register."""
        return await self._providers.serving(call.cluster).configure_slurm(call)

    @activity.defn(name="cluster_health_gate")
    async def health_gate(self, call: NodeGateCall) -> HealthReport:
        """Slurm's half of a new machine's health gate; the node agent's half is the
        workflow's (workflows/agent_gate.py)."""
        return await self._providers.serving(call.cluster).health_gate(call)

    @activity.defn(name="cluster_acceptance_job")
    async def acceptance_job(self, call: AcceptanceCall) -> AcceptanceResult:
        """One batch job over every node of the set; a retry adopts it."""
        return await self._providers.serving(call.cluster).acceptance_job(call)

    @activity.defn(name="cluster_add_users")
    async def add_users(self, call: UsersCall) -> UsersResult:
        """Each user's login (keys), and what the provider keeps of their Slurm account."""
        return await self._providers.serving(call.cluster).add_users(call)

    # --- deleting and listing -------------------------------------------------------------

    @activity.defn(name="cluster_delete")
    async def delete(self, call: DeleteCall) -> None:
        """Delete one of the cluster's resources and wait until done; gone is done."""
        return await self._providers.serving(call.cluster).delete(call)

    @activity.defn(name="cluster_inventory")
    async def inventory(self, cluster: ClusterRef) -> Inventory:
        """The cluster's parts and its machines, in node order."""
        return await self._providers.serving(cluster).inventory(cluster)
