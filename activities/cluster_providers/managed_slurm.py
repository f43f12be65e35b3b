"""Providers `sandbox` and `crusoe-managed-slurm`: a Crusoe Managed Slurm cluster and its
machines as VMs, through a Crusoe API (on the sandbox, the Crusoe emulator), and the
cluster's Slurm.

- The controller, accounting, shared home and login nodes are one Managed Slurm cluster
  (`POST /slurm/clusters`): `create_controller` creates it (or adopts the one of that name),
  the other three wait for their part of it and delete nothing of their own.
- A machine is a VM named after its Slurm node. Its create body carries
  `labels: {autoclusters.cluster, autoclusters.node-set, autoclusters.attempt}` (an EXT
  field: the emulator keeps it, the public VM API's support is UNCONFIRMED); that is how
  `inventory` knows a cluster's machines and a retried create knows its own VM.
- Slurm's side (registration, the gate, the acceptance job) is slurm_bring_up.py, through
  the worker's `SlurmBatchClient`, whose SLURM_CONF is the cluster's (on the sandbox, the
  emulator writes the configuration where the worker's SLURM_CONF points).

Crusoe errors leave every operation as crusoe_step.py says.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.exceptions import ApplicationError

from autoclusters.activities.cluster_providers.base import VM_BOOTED, VM_FAILED
from autoclusters.activities.cluster_providers.crusoe_step import crusoe_step
from autoclusters.activities.cluster_providers.slurm_bring_up import SlurmBringUp, created_epoch
from autoclusters.activities.crusoe_machines import delete_until_gone, op_meta, placements
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
from autoclusters.integrations.crusoe.errors import (
    CrusoeError,
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.resources import (
    Operation,
    OperationKind,
    SlurmCluster,
    Vm,
)
from autoclusters.integrations.slurm import SlurmBatchClient

CONTROLLER_FAILED = "ControllerFailed"
MACHINE_NAME_TAKEN = "MachineNameTaken"

# The VM labels (EXT) that tie a machine to its cluster, node set and attempt.
LABEL_CLUSTER = "autoclusters.cluster"
LABEL_NODE_SET = "autoclusters.node-set"
LABEL_ATTEMPT = "autoclusters.attempt"

RUNNING = "STATE_RUNNING"
CLUSTER_FAILED = "STATE_FAILED"
CLUSTER_DELETING = "STATE_DELETING"


def labels_of(vm: Vm) -> dict[str, str]:
    raw = (vm.model_extra or {}).get("labels")
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


def _attempt(vm: Vm) -> int:
    try:
        return int(labels_of(vm).get(LABEL_ATTEMPT, "1"))
    except ValueError:
        return 1


class ManagedSlurmProvider:
    """Providers sandbox and crusoe-managed-slurm (a ClusterProvider).

    Args:
        crusoe: the project's Crusoe client (its endpoint: Crusoe, or the emulator).
        slurm: the cluster's Slurm.
        poll_s: how often a wait polls the API or Slurm.
        register_timeout_s: how long `configure_slurm` waits for nodes to register; a node
            still missing then is left out of `registered` (the workflow replaces it).
        acceptance_timeout_s: the longest an acceptance job may take before it is cancelled
            and counted failed.
    """

    def __init__(
        self,
        crusoe: CrusoeClient,
        slurm: SlurmBatchClient,
        *,
        poll_s: float = 2.0,
        register_timeout_s: float = 300.0,
        acceptance_timeout_s: float = 1200.0,
    ) -> None:
        self._crusoe = crusoe
        self._poll_s = poll_s
        self._slurm_side = SlurmBringUp(
            slurm,
            poll_s=poll_s,
            register_timeout_s=register_timeout_s,
            acceptance_timeout_s=acceptance_timeout_s,
        )

    # --- the cluster: controller, accounting, shared home, login ------------------------

    async def create_controller(self, call: ProviderCall) -> Resource:
        """Create the Managed Slurm cluster (or adopt the one with the spec's name: a retry,
        or a 409) and wait until it runs."""
        spec = call.spec
        async with crusoe_step(f"creating Slurm cluster {spec.name}"):
            found = await self._crusoe.find_slurm_cluster(spec.name)
            if found is None:
                body = {
                    "name": spec.name,
                    "location": spec.location,
                    "login_replicas": spec.login.count,
                    "root_ssh_pub_keys": list(spec.login.ssh_public_keys),
                    "home_volume_size": f"{spec.shared_home.size}Gi",
                    "accounting_enabled": spec.accounting,  # EXT
                }
                if spec.login.instance_type:
                    body["login_node_type"] = spec.login.instance_type
                try:
                    op = await self._crusoe.create_slurm_cluster(body)
                except CrusoeUnavailable as e:
                    if e.status != 409:
                        raise
                    found = await self._crusoe.find_slurm_cluster(spec.name)
                    if found is None:  # deleted between the 409 and the list: try again
                        raise
                else:
                    await self._created(op)
            cid = found.id if found is not None else await self._cluster_id(spec.name)
            try:
                await self._wait_cluster(cid, lambda c: c.state == RUNNING, "running")
            except ApplicationError as e:
                if e.type == CONTROLLER_FAILED:
                    # A failed cluster is of no use and holds the name: delete it, so the
                    # spec can be provisioned again once the cause is fixed.
                    await self._gone(
                        "slurm_cluster",
                        lambda: self._crusoe.delete_slurm_cluster(cid),
                        lambda: self._crusoe.get_slurm_cluster(cid),
                    )
                raise
        return Resource(kind="controller", id=cid, name=spec.name)

    async def _created(self, op: Operation) -> None:
        """Wait for the create. A FAILED one that left the cluster STATE_FAILED is reported
        from the cluster (its issues, by the caller); one that left it half made deletes it
        and raises, so the activity's retry creates it anew."""
        try:
            await self._wait_op(op)
        except CrusoeOperationFailed:
            cid = op_meta(op, "slurm_cluster_id")
            if cid is None:
                raise
            with contextlib.suppress(CrusoeNotFound):
                if (await self._crusoe.get_slurm_cluster(cid)).state == CLUSTER_FAILED:
                    return
            await self._gone(
                "slurm_cluster",
                lambda: self._crusoe.delete_slurm_cluster(cid),
                lambda: self._crusoe.get_slurm_cluster(cid),
            )
            raise

    async def create_accounting(self, call: ProviderCall) -> Resource:
        """slurmdbd comes with the cluster (`accounting_enabled`): wait until it runs."""
        async with crusoe_step(f"waiting for the accounting of {call.cluster.name}"):
            cid = await self._controller(call)
            await self._wait_cluster(
                cid, lambda c: c.accounting_state == RUNNING, "accounting running"
            )
        return Resource(
            kind="accounting", id=f"{cid}/accounting", name=f"{call.spec.name}-slurmdbd"
        )

    async def create_shared_home(self, call: ProviderCall) -> Resource:
        """/home comes with the cluster (`home_volume_size`): wait until it is reported."""
        async with crusoe_step(f"waiting for the shared home of {call.cluster.name}"):
            cid = await self._controller(call)
            cluster = await self._wait_cluster(
                cid, lambda c: bool(c.home_volume_size), "a home volume"
            )
        return Resource(
            kind="shared_home",
            id=f"{cid}/home",
            name=f"{call.spec.name}-home-{cluster.home_volume_size}",
        )

    async def create_login_nodes(self, call: ProviderCall) -> Resource:
        """The login nodes come with the cluster: wait until their endpoint answers."""
        async with crusoe_step(f"waiting for the login nodes of {call.cluster.name}"):
            cid = await self._controller(call)
            cluster = await self._wait_cluster(
                cid, lambda c: bool(c.login_node_endpoint), "a login endpoint"
            )
        return Resource(kind="login", id=f"{cid}/login", name=str(cluster.login_node_endpoint))

    # --- machines -----------------------------------------------------------------------

    async def create_machine(self, call: MachineCall) -> Machine:
        """A VM named after the node. A VM of that name from this attempt (a retry) is
        adopted; one from an earlier attempt (deleted by the workflow) is waited out."""
        ns = call.node_set
        async with crusoe_step(f"creating {call.node} (attempt {call.attempt})"):
            vm = await self._own_vm(call)
            if vm is None:
                body: dict[str, Any] = {
                    "name": call.node,
                    "type": ns.instance_type,
                    "location": call.cluster.location,
                    "labels": {  # EXT: see the module's docstring
                        LABEL_CLUSTER: call.cluster.name,
                        LABEL_NODE_SET: ns.name,
                        LABEL_ATTEMPT: str(call.attempt),
                    },
                }
                if ns.ib_partition:
                    body["host_channel_adapters"] = [{"ib_partition_id": ns.ib_partition}]
                op = await self._crusoe.create_vm(body)
                vm_id = op_meta(op, "vm_id")
                if vm_id is None:
                    made = await self._crusoe.find_vm_by_name(call.node)
                    if made is None:
                        raise CrusoeError(f"VM {call.node} was created but is not listed")
                    vm_id = made.id
            else:
                vm_id = vm.id
        return Machine(
            cluster=call.cluster,
            node_set=ns.name,
            node=call.node,
            machine_id=vm_id,
            attempt=call.attempt,
        )

    async def _own_vm(self, call: MachineCall) -> Vm | None:
        """This attempt's VM if a lost try made it; None when one must be created."""
        while True:
            vm = await self._crusoe.find_vm_by_name(call.node)
            if vm is None:
                return None
            labels = labels_of(vm)
            if labels.get(LABEL_CLUSTER) != call.cluster.name:
                raise ApplicationError(
                    f"a VM named {call.node} ({vm.id}) exists in project "
                    f"{self._crusoe.project_id} and is not a machine of cluster "
                    f"{call.cluster.name}",
                    type=MACHINE_NAME_TAKEN,
                    non_retryable=True,
                )
            if _attempt(vm) >= call.attempt:
                return vm
            # An earlier attempt's VM: the workflow deleted it; wait until it is gone.
            await asyncio.sleep(self._poll_s)

    async def wait_booted(self, machine: Machine) -> BootResult:
        """Until the VM runs (booted) or fails (not booted, with the provider's reason). A
        boot that hangs is waited on, heartbeating: the workflow's timeout decides."""
        async with crusoe_step(f"waiting for {machine.node} ({machine.machine_id}) to boot"):
            while True:
                try:
                    vm = await self._crusoe.get_vm(machine.machine_id)
                except CrusoeNotFound:
                    return BootResult(booted=False, detail=f"VM {machine.machine_id} is gone")
                if vm.state in VM_BOOTED:
                    return BootResult(booted=True)
                if vm.state in VM_FAILED:
                    return BootResult(booted=False, detail=await self._boot_failure(vm))
                await asyncio.sleep(self._poll_s)

    async def _boot_failure(self, vm: Vm) -> str:
        """The create operation's message ("VM gpu-02 failed to boot"), else the state."""
        for op in reversed(await self._crusoe.list_operations("vm", resource_id=vm.id)):
            if op.state == "FAILED":
                return op.failure_message()
        return f"VM {vm.name} is {vm.state}"

    async def discover_topology(self, call: TopologyCall) -> list[Placement]:
        """Each machine's pod and leaf from its VM's `topology` (EXT); unknown: unplaced."""
        async with crusoe_step(f"reading the fabric of {len(call.machines)} machines"):
            return await placements(self._crusoe, call.machines)

    # --- Slurm ----------------------------------------------------------------------------

    async def configure_slurm(self, call: SlurmConfigCall) -> SlurmConfigResult:
        """Write the node layout (EXT PUT .../configuration), then wait, bounded, until
        every machine's node answers in Slurm from a slurmd started after its VM was
        created (a replaced machine's old slurmd, still counted as responding until
        SlurmdTimeout, is not the new one). A node that never does is not `registered`."""
        wanted = sorted({m.node for m in call.machines})
        async with crusoe_step(f"configuring Slurm of {call.cluster.name}"):
            cid = await self._cluster_id(call.cluster.name)
            op = await self._crusoe.configure_slurm_cluster(
                cid,
                {
                    "node_sets": [s.model_dump() for s in call.node_sets],
                    "topology_conf": call.topology_conf,
                    "drained": dict(call.drained),
                },
            )
            await self._wait_op(op)
            vms = await self._crusoe.list_vms(ids=[m.machine_id for m in call.machines])
            created = {vm.name: created_epoch(vm.created_at) for vm in vms}
            registered = await self._slurm_side.registered(wanted, created)
        return SlurmConfigResult(registered=registered)

    async def health_gate(self, call: NodeGateCall) -> HealthReport:
        return await self._slurm_side.health_gate(call)

    async def acceptance_job(self, call: AcceptanceCall) -> AcceptanceResult:
        return await self._slurm_side.acceptance_job(call)

    async def add_users(self, call: UsersCall) -> UsersResult:
        """Each user's login (keys) and, with accounting, Slurm account and association
        (EXT POST .../users, idempotent by name)."""
        added: list[str] = []
        async with crusoe_step(f"adding {len(call.users)} users to {call.cluster.name}"):
            cid = await self._cluster_id(call.cluster.name)
            for user in call.users:
                await self._crusoe.add_slurm_user(
                    cid,
                    {
                        "name": user.name,
                        "ssh_public_keys": list(user.ssh_public_keys),
                        "slurm_account": user.slurm_account,
                    },
                )
                added.append(user.name)
        return UsersResult(added=added)

    # --- deleting and listing -------------------------------------------------------------

    async def delete(self, call: DeleteCall) -> None:
        """A machine: delete its VM. The controller: delete the Managed Slurm cluster. Both
        wait until done; already gone (404) is done. Accounting, shared home and login
        nodes go with the cluster: nothing to do for them."""
        res = call.resource
        async with crusoe_step(f"deleting {res.kind} {res.name} ({res.id})"):
            if res.kind == "machine":
                await self._delete_vm(res.id)
            elif res.kind == "controller":
                await self._gone(
                    "slurm_cluster",
                    lambda: self._crusoe.delete_slurm_cluster(res.id),
                    lambda: self._crusoe.get_slurm_cluster(res.id),
                )

    async def _delete_vm(self, vm_id: str) -> None:
        await self._gone(
            "vm", lambda: self._crusoe.delete_vm(vm_id), lambda: self._crusoe.get_vm(vm_id)
        )

    async def _gone(
        self,
        kind: OperationKind,
        delete: Callable[[], Awaitable[Operation]],
        get: Callable[[], Awaitable[Any]],
    ) -> None:
        await delete_until_gone(self._crusoe, delete, get, kind, self._poll_s)

    async def inventory(self, cluster: ClusterRef) -> Inventory:
        """The cluster's parts (if the Managed Slurm cluster exists) and its machines: the
        VMs labelled with its name, in node order."""
        async with crusoe_step(f"listing cluster {cluster.name}"):
            found = await self._crusoe.find_slurm_cluster(cluster.name)
            vms = await self._crusoe.list_vms()
        resources: list[Resource] = []
        if found is not None:
            cid = found.id
            resources.append(Resource(kind="controller", id=cid, name=found.name))
            if found.accounting_enabled:
                resources.append(
                    Resource(
                        kind="accounting", id=f"{cid}/accounting", name=f"{found.name}-slurmdbd"
                    )
                )
            if found.home_volume_size:
                resources.append(
                    Resource(
                        kind="shared_home",
                        id=f"{cid}/home",
                        name=f"{found.name}-home-{found.home_volume_size}",
                    )
                )
            if found.login_node_endpoint:
                resources.append(
                    Resource(kind="login", id=f"{cid}/login", name=found.login_node_endpoint)
                )
        machines = [
            Machine(
                cluster=cluster,
                node_set=labels_of(vm).get(LABEL_NODE_SET, ""),
                node=vm.name,
                machine_id=vm.id,
                attempt=_attempt(vm),
            )
            for vm in sorted(vms, key=lambda v: (v.name, v.created_at))
            if labels_of(vm).get(LABEL_CLUSTER) == cluster.name
        ]
        resources += [m.resource() for m in machines]
        return Inventory(resources=resources, machines=machines)

    # --- helpers --------------------------------------------------------------------------

    async def _wait_op(self, op: Operation, kind: OperationKind = "slurm_cluster") -> Operation:
        return await self._crusoe.wait_operation(op, kind, poll_s=self._poll_s)

    async def _cluster_id(self, name: str) -> str:
        found = await self._crusoe.find_slurm_cluster(name)
        if found is None:
            raise ApplicationError(
                f"no Managed Slurm cluster named {name} in project {self._crusoe.project_id}",
                type="ClusterNotFound",
                non_retryable=True,
            )
        return found.id

    async def _controller(self, call: ProviderCall) -> str:
        if call.controller is not None:
            return call.controller.id
        return await self._cluster_id(call.spec.name)

    async def _wait_cluster(
        self, cid: str, ready: Callable[[SlurmCluster], bool], what: str
    ) -> SlurmCluster:
        """Poll the cluster until `ready`; a FAILED cluster raises (non-retryable)."""
        while True:
            cluster = await self._crusoe.get_slurm_cluster(cid)
            if ready(cluster):
                return cluster
            if cluster.state == CLUSTER_FAILED:
                raise ApplicationError(
                    f"Slurm cluster {cluster.name} ({cid}) failed before {what}: "
                    f"{cluster.issues_text()}",
                    type=CONTROLLER_FAILED,
                    non_retryable=True,
                )
            if cluster.state == CLUSTER_DELETING:
                # A teardown's leftover under the same name: a later try may create anew.
                raise ApplicationError(
                    f"Slurm cluster {cluster.name} ({cid}) is being deleted",
                    type="ClusterDeleting",
                )
            await asyncio.sleep(self._poll_s)
