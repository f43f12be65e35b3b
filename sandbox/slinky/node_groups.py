"""The node groups the sandbox's cluster autoscaler (sandbox/slinky/autoscaler.py) grows and
shrinks: what the cloud offers to add a machine behind a NodeSet's Nodes.

- CMK platform: the node pool whose `node_labels` the NodeSet selects (`PoolGroup`): its
  `count` raised makes VMs; lowered, then a VM deleted, removes one (Crusoe's autoscaler
  does it that way, §2.4).
- Managed Slurm: the Managed Slurm cluster's node set (`ManagedGroup`): a machine is a VM
  named as its Slurm node (`gpu-NN`, the next free number) made like the set's first, and
  the node in the cluster's configuration (PUT before the VM boots, so its slurmd starts
  with it: sandbox/machines/backend.py); removing it takes it out of the configuration, then deletes
  the VM. Its topology gets the node on a switch of its own (sandbox/slurm/topology.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import httpx

from autoclusters.integrations.crusoe import CrusoeClient
from autoclusters.integrations.crusoe.resources import NodePool
from autoclusters.sandbox.slurm.topology import place_unplaced

Obj = dict[str, Any]
CONFIGURE_TIMEOUT_S = 120  # a configuration restarts slurmctld


class NodeGroup(Protocol):
    id: str
    name: str
    size: int

    async def machines(self) -> list[str]:
        """The names of its machines (each one's Node is named so), booted or not."""
        ...

    async def grow(self, target: int) -> list[str]:
        """Machines up to `target`; the names of those made."""
        ...

    async def remove(self, machine: str) -> None: ...


def _labels(pool: NodePool) -> dict[str, str]:
    labels = (pool.model_extra or {}).get("node_labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


class PoolGroup:
    def __init__(self, crusoe: CrusoeClient, pool: NodePool) -> None:
        self._crusoe, self._pool = crusoe, pool
        self.id, self.name, self.size = pool.id, pool.name, pool.count

    async def machines(self) -> list[str]:
        return [vm.name for vm in await self._crusoe.node_pool_vms(self.id)]

    async def grow(self, target: int) -> list[str]:
        before = {vm.id for vm in await self._crusoe.node_pool_vms(self.id)}
        await self._crusoe.patch_node_pool(self.id, {"count": target})
        after = await self._crusoe.node_pool_vms(self.id)  # defined at once, booting
        return sorted(vm.name for vm in after if vm.id not in before)

    async def remove(self, machine: str) -> None:
        vm = next((v for v in await self._crusoe.node_pool_vms(self.id) if v.name == machine), None)
        if vm is None:
            return
        # The count first: the pool must not refill what is deleted.
        await self._crusoe.patch_node_pool(self.id, {"count": max(self.size - 1, 0)})
        await self._crusoe.delete_vm(vm.id)


class ManagedGroup:
    def __init__(self, crusoe: CrusoeClient, cluster_id: str, node_set: str, config: Obj) -> None:
        self._crusoe, self._cluster, self._config = crusoe, cluster_id, config
        self.id, self.name = f"{cluster_id}/{node_set}", node_set
        self._set = next(s for s in config["node_sets"] if s["name"] == node_set)
        self.size = len(self._set["nodes"])

    async def machines(self) -> list[str]:
        return list(self._set["nodes"])

    async def _configure(self, nodes: list[str]) -> None:
        self._set["nodes"] = nodes
        every = [n for s in self._config["node_sets"] for n in s["nodes"]]
        self._config["topology_conf"] = place_unplaced(self._config.get("topology_conf", ""), every)
        op = await self._crusoe.configure_slurm_cluster(self._cluster, self._config)
        await self._crusoe.wait_operation(op, "slurm_cluster", timeout_s=CONFIGURE_TIMEOUT_S)

    async def grow(self, target: int) -> list[str]:
        template = await self._crusoe.find_vm_by_name(self._set["nodes"][0])
        if template is None:
            raise LookupError(f"no VM for {self._set['nodes'][0]} to make a machine like")
        taken = {vm.name for vm in await self._crusoe.list_vms()}
        taken |= {n for s in self._config["node_sets"] for n in s["nodes"]}
        prefix = self._set["nodes"][0].rsplit("-", 1)[0]
        new: list[str] = []
        number = 0
        while len(new) < target - self.size:
            number += 1
            name = f"{prefix}-{number:02d}"
            if name not in taken:
                new.append(name)
        await self._configure([*self._set["nodes"], *new])
        spec = template.model_dump(exclude={"id", "state", "created_at", "name", "topology"})
        for name in new:
            await self._crusoe.create_vm({**spec, "name": name})
        return new

    async def remove(self, machine: str) -> None:
        await self._configure([n for n in self._set["nodes"] if n != machine])
        vm = await self._crusoe.find_vm_by_name(machine)
        if vm is not None:
            await self._crusoe.delete_vm(vm.id)


class PoolCloud:
    """CMK: a NodeSet's group is the node pool with its node labels."""

    def __init__(self, crusoe: CrusoeClient) -> None:
        self._crusoe = crusoe

    async def group_for(self, selector: dict[str, str], nodes: list[str]) -> NodeGroup | None:
        for pool in await self._crusoe.list_node_pools():
            labels = _labels(pool)
            if all(labels.get(k) == v for k, v in selector.items()):
                return PoolGroup(self._crusoe, pool)
        return None

    async def group(self, group_id: str) -> NodeGroup | None:
        for pool in await self._crusoe.list_node_pools():
            if pool.id == group_id:
                return PoolGroup(self._crusoe, pool)
        return None


class ManagedCloud:
    """Managed Slurm: a NodeSet's group is the cluster's node set its Nodes' machines are in.
    The configuration is the emulator's extension, not in the API's cluster: read from the
    emulator's own side (`/_emulator/state`), as the cloud's autoscaler sees its clusters."""

    def __init__(self, crusoe: CrusoeClient, state_url: str) -> None:
        self._crusoe, self._state_url = crusoe, state_url

    async def _groups(self) -> list[ManagedGroup]:
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.get(self._state_url)
            r.raise_for_status()
            clusters = r.json().get("slurm_clusters") or {}
        out = []
        for cid, cluster in sorted(clusters.items()):
            config = cluster.get("configuration")
            for s in (config or {}).get("node_sets") or []:
                out.append(ManagedGroup(self._crusoe, cid, s["name"], config))
        return out

    async def group_for(self, selector: dict[str, str], nodes: list[str]) -> NodeGroup | None:
        for g in await self._groups():
            if set(nodes) & set(await g.machines()):
                return g
        return None

    async def group(self, group_id: str) -> NodeGroup | None:
        return next((g for g in await self._groups() if g.id == group_id), None)
