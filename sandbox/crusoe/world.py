"""What the Crusoe emulator knows: VMs, node pools, clusters, and async operations.

Operations run as asyncio tasks on the server's loop and take `operation_s` (plus the boot
delay where a machine boots); while one runs on a VM, other mutations of that VM get 409.
Machine lifecycle events (create, reset, stop, start, delete) go to a `VmBackend`: the
sandbox's backend stops and starts slurmd; `InMemoryBackend` only records them. A backend
may also run Managed Slurm clusters (`SlurmBackend`: create, configure, users, delete).
The world is saved to `state_file` after each change, so a restarted emulator keeps its VMs
(an operation cut short by the restart ends FAILED).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from autoclusters.sandbox.crusoe.cmk_models import AUTOCLUSTERS_ADD_ON, CMK_VERSION
from autoclusters.sandbox.crusoe.slurm_models import (
    BootFault,
    ClusterStarted,
    SlurmCluster,
    SlurmUser,
    vm_topology,
)

__all__ = [
    "Cluster",
    "EmulatedVm",
    "EmulatorConfig",
    "InMemoryBackend",
    "NodePool",
    "Operation",
    "SlurmBackend",
    "VmBackend",
    "World",
]

log = logging.getLogger(__name__)

OperationKind = Literal["vm", "node_pool", "autocluster", "slurm_cluster", "kubernetes_cluster"]


def now_rfc3339() -> str:
    # Microseconds, so that created_at strings sort in creation order.
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def new_id() -> str:
    return str(uuid.uuid4())


class EmulatorConfig(BaseModel):
    access_key_id: str
    secret_key: SecretStr
    project_id: str
    max_skew_s: float = 300.0  # the signed timestamp may be this far off, either way
    operation_s: float = 0.5  # how long an async operation takes
    boot_delay_s: float = 2.0  # how long a new VM takes to be RUNNING
    state_file: Path | None = None
    # What a CMK cluster's get-credentials hands out (the sandbox's Kubernetes emulator's
    # kubeconfig); None: the emulator has no Kubernetes API to give credentials for.
    kubeconfig: Path | None = None


class EmulatedVm(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str = Field(default_factory=new_id)
    name: str
    state: str = "RUNNING"
    type: str = "h100-80gb-sxm-ib.8x"
    location: str = "us-east1-a"
    project_id: str = ""
    created_at: str = Field(default_factory=now_rfc3339)
    # EXT: where the machine sits in the fabric (the provider's topology discovery).
    topology: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _placed(self) -> EmulatedVm:
        if not self.topology:
            self.topology = vm_topology(self.name)
        return self


class NodePool(BaseModel):
    id: str = Field(default_factory=new_id)
    name: str = ""
    cluster_id: str = ""
    project_id: str = ""
    count: int = 0
    state: str = "STATE_RUNNING"
    instance_ids: list[str] = Field(default_factory=list)
    # What a pool made through the API gives its new VMs (`POST .../nodepools`).
    product_name: str = ""
    location: str = ""
    node_labels: dict[str, str] = Field(default_factory=dict)
    node_taints: list[dict[str, Any]] = Field(default_factory=list)
    transport_partition_id: str | None = None
    # Specs of deleted VMs whose replacement has not booted yet.
    pending: list[dict[str, Any]] = Field(default_factory=list)
    made: int = 0  # VMs this pool has made: the next one is named `<pool name>-<made + 1>`

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"pending", "made"})

    def wants_replacement(self) -> bool:
        """A managed pool refills to its `count`: after a count PATCHed down, a deleted VM
        is not replaced (Crusoe's autoscaler scales down that way, §2.4)."""
        return len(self.instance_ids) + len(self.pending) < self.count


class Cluster(BaseModel):
    """A CMK cluster (`/kubernetes/clusters`, `sandbox/crusoe/cmk_api.py`).

    Every field has a default, so a seed may give only `id` and `name`, and a state file
    written when clusters had nothing more still loads. A seeded cluster runs at once."""

    id: str = Field(default_factory=new_id)
    name: str = ""
    # The AutoClusters add-on (what `remediate` needs), kept in step with `add_ons`.
    autoclusters: bool = True
    project_id: str = ""
    location: str = ""
    version: str = CMK_VERSION
    # STATE_PROVISIONING | STATE_RUNNING | STATE_DELETING | STATE_FAILED: the node pools'
    # words (crusoe.md §2.4); the API's own list of cluster states is not published.
    state: str = "STATE_RUNNING"
    add_ons: list[str] = Field(default_factory=list)
    subnet_id: str = ""
    private: bool = False
    cluster_cidr: str = ""
    service_cluster_ip_range: str = ""
    apiserver_extra_args: dict[str, str] = Field(default_factory=dict)
    controller_manager_extra_args: dict[str, str] = Field(default_factory=dict)
    scheduler_extra_args: dict[str, str] = Field(default_factory=dict)
    kubelogin_args: dict[str, str] = Field(default_factory=dict)
    created_at: str = Field(default_factory=now_rfc3339)
    updated_at: str = ""

    @model_validator(mode="after")
    def _autoclusters_is_an_add_on(self) -> Cluster:
        if AUTOCLUSTERS_ADD_ON in self.add_ons:
            self.autoclusters = True
        elif self.autoclusters:
            self.add_ons = [*self.add_ons, AUTOCLUSTERS_ADD_ON]
        return self

    def public(self, node_pools: list[str]) -> dict[str, Any]:
        """The API's KubernetesCluster; `node_pools` are the ids of the cluster's pools."""
        return {**self.model_dump(exclude={"autoclusters"}), "node_pools": node_pools}


class Operation(BaseModel):
    operation_id: str = Field(default_factory=new_id)
    kind: OperationKind
    state: Literal["IN_PROGRESS", "SUCCEEDED", "FAILED"] = "IN_PROGRESS"
    resource_id: str = ""
    started_at: str = Field(default_factory=now_rfc3339)
    completed_at: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    # The VM's name when the operation started (a node's machine is named after the node,
    # and a deleted VM leaves the world): the emulator's own record, not part of the API.
    resource_name: str = ""

    def public(self) -> dict[str, Any]:
        return self.model_dump(exclude={"kind", "resource_id", "resource_name"}, exclude_none=True)

    def record(self) -> dict[str, Any]:
        """What `/_emulator/operations` lists: which operation ran on which machine."""
        return {
            "operation_id": self.operation_id,
            "kind": self.kind,
            "action": self.metadata.get("action") or self.metadata.get("operation_type", ""),
            "vm_id": self.resource_id,
            "vm_name": self.resource_name,
            "state": self.state,
            "started_at": self.started_at,
            "completed_at": self.completed_at,
        }


class World(BaseModel):
    vms: dict[str, EmulatedVm] = Field(default_factory=dict)
    pools: dict[str, NodePool] = Field(default_factory=dict)
    clusters: dict[str, Cluster] = Field(default_factory=dict)
    slurm_clusters: dict[str, SlurmCluster] = Field(default_factory=dict)
    operations: dict[str, Operation] = Field(default_factory=dict)

    def pool_of(self, vm_id: str) -> NodePool | None:
        return next((p for p in self.pools.values() if vm_id in p.instance_ids), None)

    def vm_named(self, name: str) -> EmulatedVm | None:
        return next((vm for vm in self.vms.values() if vm.name == name), None)


class VmBackend(Protocol):
    """What happens to the machine behind a VM. Each call gets a copy of the VM."""

    async def on_create(self, vm: EmulatedVm) -> None: ...
    async def on_reset(self, vm: EmulatedVm) -> None: ...
    async def on_stop(self, vm: EmulatedVm) -> None: ...
    async def on_start(self, vm: EmulatedVm) -> None: ...
    async def on_delete(self, vm: EmulatedVm) -> None: ...


class SlurmBackend(Protocol):
    """Optional hooks of a backend that runs Managed Slurm clusters (each gets a copy).

    `running` names the VMs that are RUNNING now: their slurmd should run once the
    configuration lists them."""

    async def on_cluster_create(self, cluster: SlurmCluster) -> ClusterStarted: ...
    async def on_cluster_configure(
        self, cluster: SlurmCluster, running: list[str]
    ) -> ClusterStarted: ...
    async def on_cluster_user(self, cluster: SlurmCluster, user: SlurmUser) -> None: ...
    async def on_cluster_delete(self, cluster: SlurmCluster) -> None: ...


class InMemoryBackend:
    """No machines: records `(event, vm or cluster name, id)` in `events`, for tests to read."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def on_create(self, vm: EmulatedVm) -> None:
        self.events.append(("create", vm.name, vm.id))

    async def on_reset(self, vm: EmulatedVm) -> None:
        self.events.append(("reset", vm.name, vm.id))

    async def on_stop(self, vm: EmulatedVm) -> None:
        self.events.append(("stop", vm.name, vm.id))

    async def on_start(self, vm: EmulatedVm) -> None:
        self.events.append(("start", vm.name, vm.id))

    async def on_delete(self, vm: EmulatedVm) -> None:
        self.events.append(("delete", vm.name, vm.id))

    async def on_cluster_create(self, cluster: SlurmCluster) -> ClusterStarted:
        self.events.append(("cluster_create", cluster.name, cluster.id))
        return ClusterStarted(
            login_node_endpoint="127.0.0.1:22",
            accounting_state="STATE_RUNNING" if cluster.accounting_enabled else None,
        )

    async def on_cluster_configure(
        self, cluster: SlurmCluster, running: list[str]
    ) -> ClusterStarted:
        self.events.append(("cluster_configure", cluster.name, cluster.id))
        listed = bool(cluster.configuration and cluster.configuration.nodes())
        return ClusterStarted(
            login_node_endpoint=cluster.login_node_endpoint,
            accounting_state=cluster.accounting_state,
            controller_state="STATE_RUNNING" if listed else None,
        )

    async def on_cluster_user(self, cluster: SlurmCluster, user: SlurmUser) -> None:
        self.events.append(("cluster_user", user.name, cluster.id))

    async def on_cluster_delete(self, cluster: SlurmCluster) -> None:
        self.events.append(("cluster_delete", cluster.name, cluster.id))


class Engine:
    """Runs operations against the world and keeps it saved."""

    def __init__(self, config: EmulatorConfig, backend: VmBackend) -> None:
        self.config = config
        self.backend = backend
        self.world = self._load()
        self.busy: dict[str, str] = {}  # VM id -> the operation running on it
        self.failures: list[str] = []  # messages: the next operations end FAILED with them
        self.boot_faults: list[BootFault] = []  # the next boots of a name fail or hang
        self.max_vms: int | None = None  # the project's VM quota (None: no limit)
        self.hanging: dict[str, asyncio.Event] = {}  # VM id -> set when it is deleted
        self.cluster_locks: dict[str, asyncio.Lock] = {}  # one operation at a time per cluster
        self._tasks: set[asyncio.Task[None]] = set()

    # --- lifecycle ------------------------------------------------------------------------

    def resume(self) -> None:
        """On startup: boot the replacements and new pool VMs a restart interrupted."""
        for pool in self.world.pools.values():
            for spec in list(pool.pending):
                self._spawn(self._replace_in_pool(pool.id, spec))
            pending = {str(spec.get("name")) for spec in pool.pending}
            for vm_id in pool.instance_ids:
                vm = self.world.vms.get(vm_id)
                # A pool's new VM whose boot the restart cut short boots again.
                if vm is not None and vm.state == "DEFINING" and vm.name not in pending:
                    self.boot_later(vm)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.save()

    def save(self) -> None:
        path = self.config.state_file
        if path is None:
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.world.model_dump_json(indent=2))
        tmp.replace(path)

    def _load(self) -> World:
        path = self.config.state_file
        if path is None or not path.exists():
            return World()
        world = World.model_validate(json.loads(path.read_text()))
        for op in world.operations.values():
            if op.state == "IN_PROGRESS":
                op.state, op.completed_at = "FAILED", now_rfc3339()
                op.result = {"code": "aborted", "message": "the emulator restarted"}
        return world

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- operations -----------------------------------------------------------------------

    def start(
        self,
        kind: OperationKind,
        vm_id: str,
        work: Callable[[Operation], Awaitable[None]],
        metadata: dict[str, Any] | None = None,
        *,
        resource_name: str | None = None,
        exclusive: bool = True,
        on_failed: Callable[[Operation], None] | None = None,
    ) -> Operation:
        """`exclusive`: other mutations of the resource get 409 while this one runs.
        `on_failed` sees the operation when it ends FAILED, its work done or not (an
        injected failure ends it before the work), so the resource can show it."""
        vm = self.world.vms.get(vm_id)
        op = Operation(
            kind=kind,
            resource_id=vm_id,
            resource_name=resource_name or (vm.name if vm is not None else ""),
            metadata=metadata or {},
        )
        self.world.operations[op.operation_id] = op
        if vm_id and exclusive:
            self.busy[vm_id] = op.operation_id
        self.save()
        self._spawn(self._run(op, work, on_failed))
        return op

    async def _run(
        self,
        op: Operation,
        work: Callable[[Operation], Awaitable[None]],
        on_failed: Callable[[Operation], None] | None = None,
    ) -> None:
        try:
            await asyncio.sleep(self.config.operation_s)
            if self.failures:
                raise RuntimeError(self.failures.pop(0))
            await work(op)
            op.state = "SUCCEEDED"
        except asyncio.CancelledError:
            op.state, op.result = "FAILED", {"code": "aborted", "message": "emulator stopped"}
            raise
        except Exception as e:
            log.warning("emulated operation %s failed: %s", op.operation_id, e)
            op.state, op.result = "FAILED", {"code": "operation_failed", "message": str(e)}
        finally:
            if op.state == "FAILED" and on_failed is not None:
                on_failed(op)
            op.completed_at = now_rfc3339()
            if self.busy.get(op.resource_id) == op.operation_id:
                del self.busy[op.resource_id]
            self.save()

    # --- what operations do ---------------------------------------------------------------

    def take_boot_fault(self, name: str) -> BootFault | None:
        for fault in self.boot_faults:
            if fault.name in (name, "*"):
                fault.count -= 1
                if fault.count == 0:
                    self.boot_faults.remove(fault)
                return fault
        return None

    async def boot(self, vm: EmulatedVm, fault: BootFault | None = None) -> None:
        """A new VM: defined now, RUNNING after the boot delay (or FAILED, or hanging in
        PROVISIONING until it is deleted, when `fault` says so)."""
        vm.state = "DEFINING"
        self.world.vms[vm.id] = vm
        self.save()
        deleted = asyncio.Event()
        if fault is not None and fault.mode == "hang":
            self.hanging[vm.id] = deleted  # a delete may come before it hangs
        await asyncio.sleep(self.config.boot_delay_s)
        if fault is not None and fault.mode == "fail":
            vm.state = "FAILED"
            self.save()
            raise RuntimeError(f"VM {vm.name} failed to boot")
        if fault is not None and fault.mode == "hang":
            if not deleted.is_set():
                vm.state = "PROVISIONING"
                self.save()
                await deleted.wait()
            raise RuntimeError(f"VM {vm.name} was deleted while it booted")
        await self.backend.on_create(vm.model_copy())
        vm.state = "RUNNING"
        self.save()

    async def remove(self, vm: EmulatedVm) -> NodePool | None:
        """The VM is gone: out of the world and out of its pool (returned)."""
        vm.state = "SHUTOFF"
        await self.backend.on_delete(vm.model_copy())
        self.world.vms.pop(vm.id, None)
        pool = self.world.pool_of(vm.id)
        if pool is not None:
            pool.instance_ids.remove(vm.id)
        self.save()
        return pool

    def release_hang(self, vm_id: str) -> None:
        """A hanging boot ends (FAILED) because its VM is being deleted."""
        event = self.hanging.pop(vm_id, None)
        if event is not None:
            event.set()
            self.busy.pop(vm_id, None)

    def grow_pool(self, pool: NodePool, n: int) -> list[EmulatedVm]:
        """`n` new VMs in the pool, defined now (so the quota counts them at once) and
        booting in the background: a failed boot fails the VM, not the pool's operation."""
        made = []
        for _ in range(n):
            pool.made += 1
            spec: dict[str, Any] = {
                "name": f"{pool.name}-{pool.made}",
                "type": pool.product_name,
                "location": pool.location or "us-east1-a",
                "project_id": pool.project_id,
                "state": "DEFINING",
                "node_pool_id": pool.id,
                "node_labels": dict(pool.node_labels),
            }
            if pool.transport_partition_id:
                spec["host_channel_adapters"] = [{"ib_partition_id": pool.transport_partition_id}]
            vm = EmulatedVm.model_validate(spec)
            self.world.vms[vm.id] = vm
            pool.instance_ids.append(vm.id)
            made.append(vm)
        self.save()
        return made

    def boot_later(self, vm: EmulatedVm) -> None:
        fault = self.take_boot_fault(vm.name)

        async def run() -> None:
            try:
                await self.boot(vm, fault)
            except RuntimeError as e:
                log.info("emulated pool VM: %s", e)

        self._spawn(run())

    def cluster_lock(self, cluster_id: str) -> asyncio.Lock:
        return self.cluster_locks.setdefault(cluster_id, asyncio.Lock())

    def successor_spec(self, vm: EmulatedVm) -> dict[str, Any]:
        return vm.model_dump(exclude={"id", "state", "created_at"})

    def replace_later(self, pool: NodePool, vm: EmulatedVm) -> None:
        """A managed pool notices a deleted VM and boots one with the same name."""
        spec = self.successor_spec(vm)
        pool.pending.append(spec)
        self.save()
        self._spawn(self._replace_in_pool(pool.id, spec))

    async def _replace_in_pool(self, pool_id: str, spec: dict[str, Any]) -> None:
        pool = self.world.pools[pool_id]
        # After a restart mid-boot the successor may exist already: boot that one.
        new = self.world.vm_named(str(spec.get("name")))
        if new is None or new.id not in pool.instance_ids:
            new = EmulatedVm.model_validate(spec)
            pool.instance_ids.append(new.id)
        await self.boot(new)
        pool.pending.remove(spec)
        self.save()
