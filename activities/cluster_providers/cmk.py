"""The `cluster_*` activities for provider `crusoe-cmk`: Slurm (Slinky) on an existing CMK
cluster, its machines from CMK node pools through the Crusoe API, its Slurm parts as
Kubernetes objects applied with the official `kubernetes` client
(integrations/slinky_crs.py has the bodies and names).

The mapping (crusoe.md §1.5, §2.4, §3; UNCONFIRMED where marked):

- preflight: before the Controller (the first thing made for a cluster), the CMK cluster
  `cmk_cluster_id` is read through the Crusoe API. One that does not exist, is not
  STATE_RUNNING, or lacks the Slurm operator's add-on (`slurm_operator`, UNCONFIRMED) is
  refused as `CmkClusterUnusable`, non-retryable, naming the cluster: no retry makes it
  usable, and nothing of the cluster is made. The API not answering stays an outage
  (`CrusoeUnavailable`, retried), not a refusal.
- controller: Slinky `Controller` `<cluster>` (its `configFileRefs` name the ConfigMap
  `<cluster>-slurm-conf` that configure_slurm writes topology.conf into). Slinky's CRs are
  used directly rather than Crusoe's `SlurmCluster`, whose expansion into them is Crusoe's
  operator's and not documented. A retry or an existing object of that name is adopted
  (409 -> read). Resource ids are the objects' names.
- accounting: Slinky `Accounting` `<cluster>-accounting`, and the Controller's
  `spec.accountingRef` patched to it. shared home: a `PersistentVolumeClaim` `<cluster>-home`
  (ReadWriteMany, the spec's size). login: Slinky `LoginSet` `<cluster>-login`.
  These are applied, not waited on: slurmctld's readiness shows at configure_slurm (nodes
  register through it). The Secrets each references (Slurm's and the JWT key, the
  database password, sssd.conf) are created with it, generated once (a retry keeps them),
  and deleted with it.
- machines: one CMK node pool per node set, named `<cluster>-<set>` (as its NodeSet),
  `product_name` the instance type, `transport_partition_id` the IB partition,
  `node_labels` {autoclusters.crusoe.ai/cluster, .../node-set} that the set's NodeSet selects
  (DaemonSet mode: one slurmd per node of the pool). A slot (Slurm node) holds one pool VM;
  the NodeSet's annotation `autoclusters.crusoe.ai/slots` is the ledger
  `{node: {vm, attempt}}`. Changing the pool (create, count, claims) happens under a lock:
  the NodeSet's annotation `autoclusters.crusoe.ai/pool-lock` {holder, until}, taken and
  released with resourceVersion-checked patches (409: someone else wrote; read again), so
  slots created in parallel never lose one. Under the lock a slot takes the oldest pool VM
  no slot holds; with none free it PATCHes the pool's count to (held VMs + 1) and waits
  for the new VM. The lock expires after `lock_ttl_s` (a dead worker's); the activity's
  retry holds it under the same holder id (workflow run + activity id), so it resumes at
  once. A retry whose slot already holds a VM of its attempt adopts it.
- deleting a machine: under the lock, the pool's count goes down by one (the target is
  written to the slot's ledger entry first, so a retry does not shrink twice), then the VM
  is deleted: the pool does not refill it (Crusoe's autoscaler scales down that way, §2.4).
  The next attempt of the slot grows the pool again.
- wait_booted: the VM RUNNING (FAILED/CRASHED: not booted) and, once its Kubernetes node
  (named as the VM: UNCONFIRMED) has joined, that node Ready. A node that is not there does
  not hold the boot up: configure_slurm skips it, and registration is what counts.
- topology: the VMs' `topology` (EXT), as the managed provider reads it.
- configure_slurm: topology.conf into the ConfigMap; each machine's node (named as its VM:
  UNCONFIRMED) annotated with Slinky's `hostname-override` = the slot's name, and a drained
  slot cordoned with `node-cordon-reason` (Slinky drains it in Slurm, §3); then each
  NodeSet's `replicas` and `partition.config` (after the names, so a slurmd pod is made
  under its slot's name); then the same bounded wait for
  registration through Slurm as the managed provider. A drained slot that registered is
  then drained by us in Slurm under the same reason and its Node uncordoned, so returning
  it to service (a Slurm resume) is not undone by the cordon.
- users: Crusoe `SlurmUser` `<cluster>-<user>` (OS identity and keys). Slurm accounts and
  associations are not created on this provider (no sacctmgr client yet; documented gap).
- registration, health gate and acceptance job: Slurm's side, slurm_bring_up.py, shared with
  the managed provider.
- deleting the controller deletes the cluster's NodeSets, their pools (and VMs), its
  ConfigMap and SlurmUsers too; 404 is gone.
- inventory: the objects that exist and the machines of the ledgers whose VMs exist.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.exceptions import ApplicationError

from autoclusters.activities.cluster_providers.base import VM_BOOTED, VM_FAILED
from autoclusters.activities.cluster_providers.cmk_pool_ledger import (
    PoolLedger,
    holds,
    lock_holder,
    lock_of,
)
from autoclusters.activities.cluster_providers.kube_step import kube_step
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
from autoclusters.core.cluster_spec import NodeSetSpec
from autoclusters.core.models import HealthReport
from autoclusters.integrations.crusoe.client import CrusoeClient
from autoclusters.integrations.crusoe.errors import CrusoeNotFound
from autoclusters.integrations.crusoe.resources import (
    SLURM_OPERATOR_ADD_ON,
    NodePool,
    Operation,
    OperationKind,
    Vm,
)
from autoclusters.integrations.slinky_crs import (
    ACCOUNTING,
    CONTROLLER,
    CORDON_REASON,
    HOSTNAME_OVERRIDE,
    LABEL_CLUSTER,
    LABEL_NODE_SET,
    LOGINSET,
    NODESET,
    SLURM_USER,
    TOPOLOGY_KEY,
    KubeObjects,
    Obj,
    accounting_body,
    config_map_body,
    config_map_name,
    controller_body,
    home_claim_body,
    jwt_key_ref,
    loginset_body,
    mariadb_password_ref,
    nodeset_body,
    nodeset_name,
    partition_config,
    pool_node_labels,
    secret_body,
    slots_of,
    slurm_key_ref,
    slurm_user_body,
    sssd_conf_ref,
)
from autoclusters.integrations.slurm import SlurmBatchClient

CMK_CLUSTER_UNUSABLE = "CmkClusterUnusable"
CMK_RUNNING = "STATE_RUNNING"


class CmkProvider:
    """Provider `crusoe-cmk` (a ClusterProvider).

    Args:
        crusoe: the project's Crusoe client.
        kube: the CMK cluster's objects in the namespace Slurm lives in.
        slurm: the cluster's Slurm.
        cmk_cluster_id: the CMK cluster the node pools join.
        lock_ttl_s: how long a pool lock holds when its holder stops renewing it.
    """

    def __init__(
        self,
        crusoe: CrusoeClient,
        kube: KubeObjects,
        slurm: SlurmBatchClient,
        *,
        cmk_cluster_id: str,
        poll_s: float = 2.0,
        register_timeout_s: float = 300.0,
        acceptance_timeout_s: float = 1200.0,
        lock_ttl_s: float = 120.0,
    ) -> None:
        self._crusoe = crusoe
        self._kube = kube
        self._cmk = cmk_cluster_id
        self._poll_s = poll_s
        self._ledger = PoolLedger(kube, lock_ttl_s=lock_ttl_s)
        self._slurm_side = SlurmBringUp(
            slurm,
            poll_s=poll_s,
            register_timeout_s=register_timeout_s,
            acceptance_timeout_s=acceptance_timeout_s,
        )

    # --- the cluster's parts ----------------------------------------------------------------

    async def create_controller(self, call: ProviderCall) -> Resource:
        spec = call.spec
        async with kube_step(f"checking CMK cluster {self._cmk}"):
            await self._preflight(spec.name)
        async with kube_step(f"applying Slinky Controller {spec.name}"):
            await self._kube.ensure_namespace()
            await self._ensure_secrets(spec.name, slurm_key_ref(spec.name), jwt_key_ref(spec.name))
            await self._kube.create(CONTROLLER, controller_body(spec))
        return Resource(kind="controller", id=spec.name, name=spec.name)

    async def _preflight(self, cluster: str) -> None:
        """Refuse (non-retryable) a CMK cluster that cannot take `cluster`'s Slurm. A
        CrusoeUnavailable passes through: the step keeps it an outage, which is retried."""

        def unusable(why: str) -> ApplicationError:
            return ApplicationError(
                f"CMK cluster {self._cmk} {why}: cluster {cluster} cannot be provisioned on it",
                type=CMK_CLUSTER_UNUSABLE,
                non_retryable=True,
            )

        try:
            cmk = await self._crusoe.get_kubernetes_cluster(self._cmk)
        except CrusoeNotFound as e:
            where = f"in project {self._crusoe.project_id}"
            raise unusable(f"does not exist {where} ({e.message})") from e
        if cmk.state != CMK_RUNNING:
            raise unusable(f"is {cmk.state or 'in no state'}, not {CMK_RUNNING}")
        if SLURM_OPERATOR_ADD_ON not in cmk.add_ons:
            have = ", ".join(cmk.add_ons) or "none"
            raise unusable(
                f"lacks the {SLURM_OPERATOR_ADD_ON} add-on (the Slurm operator; it has: {have})"
            )

    async def create_accounting(self, call: ProviderCall) -> Resource:
        spec = call.spec
        body = accounting_body(spec)
        name = body["metadata"]["name"]
        async with kube_step(f"applying Slinky Accounting {name}"):
            await self._ensure_secrets(spec.name, mariadb_password_ref(spec.name))
            await self._kube.create(ACCOUNTING, body)
            await self._kube.patch(
                CONTROLLER, spec.name, {"spec": {"accountingRef": {"name": name}}}
            )
        return Resource(kind="accounting", id=name, name=name)

    async def create_shared_home(self, call: ProviderCall) -> Resource:
        body = home_claim_body(call.spec)
        name = body["metadata"]["name"]
        async with kube_step(f"claiming the shared home {name}"):
            await self._kube.create_claim(body)
        return Resource(kind="shared_home", id=name, name=f"{name}-{call.spec.shared_home.size}Gi")

    async def create_login_nodes(self, call: ProviderCall) -> Resource:
        body = loginset_body(call.spec)
        name = body["metadata"]["name"]
        async with kube_step(f"applying Slinky LoginSet {name}"):
            await self._ensure_secrets(call.spec.name, sssd_conf_ref(call.spec.name))
            await self._kube.create(LOGINSET, body)
        return Resource(kind="login", id=name, name=name)

    async def _ensure_secrets(self, cluster: str, *refs: Obj) -> None:
        """The Secrets the CRs reference, each made once (a retry keeps the first's keys)."""
        for ref in refs:
            await self._kube.ensure_secret(secret_body(cluster, ref))

    # --- machines ---------------------------------------------------------------------------

    async def create_machine(self, call: MachineCall) -> Machine:
        ns, cluster = call.node_set, call.cluster.name
        name = nodeset_name(cluster, ns.name)
        holder = lock_holder()
        async with kube_step(f"creating {call.node} (attempt {call.attempt}) in pool {name}"):
            await self._kube.create(NODESET, nodeset_body(cluster, ns))
            while True:
                cr = await self._ledger.nodeset(name)
                mine = slots_of(cr).get(call.node) or {}
                if mine.get("vm") and int(mine.get("attempt", 0)) >= call.attempt:
                    vm_id = str(mine["vm"])
                    break
                if not await self._ledger.lock(cr, holder):
                    await asyncio.sleep(self._poll_s)
                    continue
                try:
                    claimed = await self._claim(call, holder)
                except BaseException:
                    await self._ledger.unlock(name, holder)
                    raise
                if claimed is not None:
                    vm_id = claimed
                    break
        return Machine(
            cluster=call.cluster,
            node_set=ns.name,
            node=call.node,
            machine_id=vm_id,
            attempt=call.attempt,
        )

    async def _claim(self, call: MachineCall, holder: str) -> str | None:
        """Under the lock: a free VM of the pool (grown by one when none is free), written
        into the ledger with the lock released in the same patch. None: the ledger changed
        under us (the lock expired and was taken): start over."""
        ns, cluster = call.node_set, call.cluster.name
        name = nodeset_name(cluster, ns.name)
        pool = await self._pool(cluster, ns.name)
        if pool is None:
            pool = await self._create_pool(cluster, ns, count=1)
        while True:
            cr = await self._ledger.nodeset(name)
            if not holds(cr, holder):
                return None
            slots = slots_of(cr)
            held = {str(s.get("vm")) for s in slots.values() if s.get("vm")}
            vms = await self._crusoe.node_pool_vms(pool.id)
            free = sorted(
                (vm for vm in vms if vm.id not in held),
                key=lambda v: (v.state in VM_FAILED, v.created_at, v.id),
            )
            if free:
                slots[call.node] = {"vm": free[0].id, "attempt": call.attempt}
                if await self._ledger.write(cr, slots, lock=None):
                    return free[0].id
                return None
            pool = await self._crusoe.get_node_pool(pool.id)
            target = max(pool.count, len(held & set(pool.instance_ids)) + 1)
            if target > pool.count:
                op = await self._crusoe.patch_node_pool(pool.id, {"count": target})
                await self._wait_op(op)
            else:
                # The pool owes VMs it has not made yet: wait for them (renewing the lock).
                await asyncio.sleep(self._poll_s)
                await self._ledger.renew(name, holder)

    async def _create_pool(self, cluster: str, ns: NodeSetSpec, *, count: int) -> NodePool:
        body: dict[str, Any] = {
            "cluster_id": self._cmk,
            "name": nodeset_name(cluster, ns.name),
            "product_name": ns.instance_type,
            "count": count,
            "node_labels": pool_node_labels(cluster, ns.name),
        }
        if ns.ib_partition:
            body["transport_partition_id"] = ns.ib_partition
        op = await self._crusoe.create_node_pool(body)
        await self._wait_op(op)
        pool_id = op_meta(op, "node_pool_id")
        if pool_id is not None:
            return await self._crusoe.get_node_pool(pool_id)
        found = await self._pool(cluster, ns.name)
        if found is None:
            raise ApplicationError(f"node pool {body['name']} was created but is not listed")
        return found

    async def _pools(self, cluster: str) -> list[NodePool]:
        prefix = f"{cluster}-"
        return [
            p
            for p in await self._crusoe.list_node_pools()
            if p.cluster_id == self._cmk
            and p.name.startswith(prefix)
            and (p.model_extra or {}).get("node_labels", {}).get(LABEL_CLUSTER, cluster) == cluster
        ]

    async def _pool(self, cluster: str, node_set: str) -> NodePool | None:
        name = nodeset_name(cluster, node_set)
        return next((p for p in await self._pools(cluster) if p.name == name), None)

    async def wait_booted(self, machine: Machine) -> BootResult:
        async with kube_step(f"waiting for {machine.node} ({machine.machine_id}) to boot"):
            while True:
                try:
                    vm = await self._crusoe.get_vm(machine.machine_id)
                except CrusoeNotFound:
                    return BootResult(booted=False, detail=f"VM {machine.machine_id} is gone")
                if vm.state in VM_BOOTED and await self._node_not_unready(vm.name):
                    return BootResult(booted=True)
                if vm.state in VM_FAILED:
                    return BootResult(
                        booted=False, detail=f"VM {vm.name} ({vm.id}) of the pool is {vm.state}"
                    )
                await asyncio.sleep(self._poll_s)

    async def _node_not_unready(self, name: str) -> bool:
        """The VM's Kubernetes node is Ready, or not there: a node that joined but is not
        Ready (kubelet still starting) is waited for; one that never shows (its name is not
        the VM's, UNCONFIRMED) does not hold the boot up."""
        node = await self._kube.get_node(name)
        if node is None:
            return True
        conditions = node.get("status", {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), None)
        return ready is not None and ready.get("status") == "True"

    async def discover_topology(self, call: TopologyCall) -> list[Placement]:
        async with kube_step(f"reading the fabric of {len(call.machines)} machines"):
            return await placements(self._crusoe, call.machines)

    # --- Slurm ------------------------------------------------------------------------------

    async def configure_slurm(self, call: SlurmConfigCall) -> SlurmConfigResult:
        cluster = call.cluster.name
        wanted = sorted({m.node for m in call.machines})
        async with kube_step(f"configuring Slurm of {cluster}"):
            await self._kube.put_config_map(
                config_map_body(cluster, {TOPOLOGY_KEY: call.topology_conf})
            )
            # The nodes' Slurm names first, then the NodeSets' replicas: the operator makes a
            # slurmd pod once the replicas allow it, under the name the Node carries then.
            vms = await self._crusoe.list_vms(ids=[m.machine_id for m in call.machines])
            by_id = {vm.id: vm for vm in vms}
            created: dict[str, float] = {}
            vm_of: dict[str, Vm] = {}
            for m in call.machines:
                vm = by_id.get(m.machine_id)
                if vm is None:
                    continue
                created[m.node] = created_epoch(vm.created_at)
                vm_of[m.node] = vm
                await self._label_node(vm, m.node, call.drained.get(m.node))
            for s in call.node_sets:
                await self._kube.patch(
                    NODESET,
                    nodeset_name(cluster, s.name),
                    {
                        "spec": {
                            "replicas": len(s.nodes),
                            "partition": {"enabled": True, "config": partition_config(s.partition)},
                        }
                    },
                )
            registered = await self._slurm_side.registered(wanted, created)
            for node in registered:
                if node in call.drained and node in vm_of:
                    await self._hand_over_drain(vm_of[node], node, call.drained[node])
        return SlurmConfigResult(registered=registered)

    async def _hand_over_drain(self, vm: Vm, slot: str, reason: str) -> None:
        """The cordon held the slot drained until its slurmd registered; from here Slurm's
        drain, under the caller's reason, holds it, and the Node is uncordoned. Left cordoned,
        the Node would drain the Slurm node again the moment the caller returns it to
        service (Slinky's cordon sync), so a returned node would not stay returned. Slurm's
        drain goes first: the operator leaves a drain that is not its own, so the node is
        never schedulable in between. A cordon with another reason is someone else's."""
        await self._slurm_side.drain(slot, reason)
        node = await self._kube.get_node(vm.name)
        notes = ((node or {}).get("metadata") or {}).get("annotations") or {}
        if node is not None and notes.get(CORDON_REASON) == reason:
            uncordon = {"annotations": {CORDON_REASON: None}}
            await self._kube.patch_node(
                vm.name, {"metadata": uncordon, "spec": {"unschedulable": None}}
            )

    async def _label_node(self, vm: Vm, slot: str, drained: str | None) -> None:
        """The VM's Kubernetes node: its Slurm name, and cordoned with the reason when the
        slot registers drained. A node not there (yet) is left: it will not register."""
        node = await self._kube.get_node(vm.name)
        if node is None:
            return
        annotations: dict[str, str] = {HOSTNAME_OVERRIDE: slot}
        patch: Obj = {"metadata": {"annotations": annotations}}
        if drained:
            annotations[CORDON_REASON] = drained
            patch["spec"] = {"unschedulable": True}
        await self._kube.patch_node(vm.name, patch)

    async def health_gate(self, call: NodeGateCall) -> HealthReport:
        return await self._slurm_side.health_gate(call)

    async def acceptance_job(self, call: AcceptanceCall) -> AcceptanceResult:
        return await self._slurm_side.acceptance_job(call)

    async def add_users(self, call: UsersCall) -> UsersResult:
        added: list[str] = []
        async with kube_step(f"adding {len(call.users)} users to {call.cluster.name}"):
            for user in call.users:
                body = slurm_user_body(call.cluster.name, user)
                _, created = await self._kube.create(SLURM_USER, body)
                if not created:  # keys may have changed: the spec wins
                    await self._kube.patch(
                        SLURM_USER, body["metadata"]["name"], {"spec": body["spec"]}
                    )
                added.append(user.name)
        return UsersResult(added=added)

    # --- deleting and listing -----------------------------------------------------------------

    async def delete(self, call: DeleteCall) -> None:
        res, cluster = call.resource, call.cluster.name
        async with kube_step(f"deleting {res.kind} {res.name} ({res.id})"):
            if res.kind == "machine":
                await self._delete_machine(cluster, res)
            elif res.kind == "controller":
                await self._delete_cluster(cluster, res.id)
            elif res.kind == "accounting":
                await self._kube.delete(ACCOUNTING, res.id)
                await self._kube.delete_secret(mariadb_password_ref(cluster)["name"])
                if await self._kube.get(CONTROLLER, cluster) is not None:
                    await self._kube.patch(CONTROLLER, cluster, {"spec": {"accountingRef": None}})
            elif res.kind == "shared_home":
                await self._kube.delete_claim(res.id)
            elif res.kind == "login":
                await self._kube.delete(LOGINSET, res.id)
                await self._kube.delete_secret(sssd_conf_ref(cluster)["name"])

    async def _delete_machine(self, cluster: str, res: Resource) -> None:
        """Shrink the VM's pool by one, then delete the VM; the ledger forgets it."""
        pool = next((p for p in await self._pools(cluster) if res.id in p.instance_ids), None)
        if pool is None:
            await self._delete_vm(res.id)  # in no pool of the cluster (any more)
            await self._forget(cluster, res.id)
            return
        name, holder = pool.name, lock_holder()
        while True:
            cr = await self._kube.get(NODESET, name)
            if cr is None:  # no ledger: the pool is not ours to shrink
                await self._delete_vm(res.id)
                return
            if await self._ledger.lock(cr, holder):
                break
            await asyncio.sleep(self._poll_s)
        try:
            cr = await self._ledger.nodeset(name)
            slots = slots_of(cr)
            slot = next((n for n, s in slots.items() if s.get("vm") == res.id), res.name)
            entry = dict(slots.get(slot) or {"vm": res.id})
            if "shrink_to" not in entry:
                current = await self._crusoe.get_node_pool(pool.id)
                if res.id not in current.instance_ids:
                    entry["shrink_to"] = current.count  # already out of the pool
                else:
                    entry["shrink_to"] = max(0, current.count - 1)
                slots[slot] = entry
                if not await self._ledger.write(cr, slots, lock=holder):
                    raise ApplicationError("the pool lock was lost; retry", type="PoolLockLost")
            op = await self._crusoe.patch_node_pool(pool.id, {"count": int(entry["shrink_to"])})
            await self._wait_op(op)
            await self._delete_vm(res.id)
            cr = await self._ledger.nodeset(name)
            slots = slots_of(cr)
            slots = {n: s for n, s in slots.items() if s.get("vm") != res.id}
            if not await self._ledger.write(cr, slots, lock=None):
                raise ApplicationError("the pool lock was lost; retry", type="PoolLockLost")
        except BaseException:
            await self._ledger.unlock(name, holder)
            raise

    async def _forget(self, cluster: str, vm_id: str) -> None:
        """Drop the VM from every ledger that still names it (resourceVersion-checked: a
        claim written meanwhile is read again, not overwritten)."""
        for cr in await self._kube.list(NODESET, f"{LABEL_CLUSTER}={cluster}"):
            while True:
                slots = slots_of(cr)
                kept = {n: s for n, s in slots.items() if s.get("vm") != vm_id}
                holder = lock_of(cr).get("holder")
                if kept == slots or await self._ledger.write(cr, kept, lock=holder):
                    break
                cr = await self._ledger.nodeset(cr["metadata"]["name"])

    async def _delete_cluster(self, cluster: str, controller: str) -> None:
        for pool in await self._pools(cluster):
            await self._gone(
                functools.partial(self._crusoe.delete_node_pool, pool.id),
                functools.partial(self._crusoe.get_node_pool, pool.id),
            )
        selector = f"{LABEL_CLUSTER}={cluster}"
        for kind in (NODESET, SLURM_USER):
            for obj in await self._kube.list(kind, selector):
                await self._kube.delete(kind, obj["metadata"]["name"])
        await self._kube.delete_config_map(config_map_name(cluster))
        await self._kube.delete(CONTROLLER, controller)
        for ref in (slurm_key_ref(cluster), jwt_key_ref(cluster)):
            await self._kube.delete_secret(ref["name"])

    async def _delete_vm(self, vm_id: str) -> None:
        await self._gone(
            lambda: self._crusoe.delete_vm(vm_id),
            lambda: self._crusoe.get_vm(vm_id),
            kind="vm",
        )

    async def _gone(
        self,
        delete: Callable[[], Awaitable[Operation]],
        get: Callable[[], Awaitable[Any]],
        *,
        kind: OperationKind = "node_pool",
    ) -> None:
        await delete_until_gone(self._crusoe, delete, get, kind, self._poll_s)

    async def inventory(self, cluster: ClusterRef) -> Inventory:
        name = cluster.name
        resources: list[Resource] = []
        machines: list[Machine] = []
        async with kube_step(f"listing cluster {name}"):
            if await self._kube.get(CONTROLLER, name) is not None:
                resources.append(Resource(kind="controller", id=name, name=name))
            if await self._kube.get(ACCOUNTING, f"{name}-accounting") is not None:
                acct = f"{name}-accounting"
                resources.append(Resource(kind="accounting", id=acct, name=acct))
            claim = await self._kube.get_claim(f"{name}-home")
            if claim is not None:
                size = claim.get("spec", {}).get("resources", {}).get("requests", {})
                resources.append(
                    Resource(
                        kind="shared_home",
                        id=f"{name}-home",
                        name=f"{name}-home-{size.get('storage', '')}",
                    )
                )
            if await self._kube.get(LOGINSET, f"{name}-login") is not None:
                resources.append(Resource(kind="login", id=f"{name}-login", name=f"{name}-login"))
            live = {vm_id for p in await self._pools(name) for vm_id in p.instance_ids}
            for cr in await self._kube.list(NODESET, f"{LABEL_CLUSTER}={name}"):
                node_set = (cr["metadata"].get("labels") or {}).get(LABEL_NODE_SET, "")
                for node, slot in slots_of(cr).items():
                    if slot.get("vm") in live:
                        machines.append(
                            Machine(
                                cluster=cluster,
                                node_set=node_set,
                                node=node,
                                machine_id=str(slot["vm"]),
                                attempt=int(slot.get("attempt", 1)),
                            )
                        )
        machines.sort(key=lambda m: m.node)
        resources += [m.resource() for m in machines]
        return Inventory(resources=resources, machines=machines)

    async def _wait_op(self, op: Operation) -> Operation:
        return await self._crusoe.wait_operation(op, "node_pool", poll_s=self._poll_s)
