"""The sandbox's machines: a node's "machine" is its slurmd process (and, in Kubernetes
mode, the Node its kubelet would register).

Powering a machine off stops its slurmd and every job step still running on it; powering
it on starts a fresh slurmd. `SandboxMachines` is the Crusoe emulator's VM backend: what the
emulated cloud does to a VM happens to the sandbox node of the same name. A machine whose
node the sandbox's slurm.conf does not list yet only boots: its slurmd starts when a
Managed Slurm configuration lists it (`SandboxMachines` runs the Managed Slurm cluster
too, through `sandbox/slurm/controller.py`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from pathlib import Path

import httpx

from autoclusters.clients.agent import fake_backend
from autoclusters.core.kubernetes import INSTANCE_ID_LABEL
from autoclusters.core.policy import Rung
from autoclusters.core.sharing import POOL_LABEL, POOL_TAINT_KEY
from autoclusters.sandbox.crusoe.slurm_models import ClusterStarted, SlurmCluster, SlurmUser
from autoclusters.sandbox.crusoe.world import EmulatedVm
from autoclusters.sandbox.machines import agent_targets, fault_effects
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines.hardware import Hardware
from autoclusters.sandbox.machines.racks import rack_labels
from autoclusters.sandbox.machines.vms import VmRecord, VmRegistry
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import GPUS_PER_NODE, SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable, kill_sessions, sessions_holding
from autoclusters.sandbox.slurm.controller import ManagedSlurm
from autoclusters.sandbox.slurm.files import listed_nodes


def power_off(cfg: SandboxConfig, node: str) -> None:
    """The machine goes down: its slurmd and every job step still running on it (what a
    fault's effect stopped first, by PID: sandbox/machines/fault_effects.py)."""
    fault_effects.power_off(cfg, node)
    ProcessTable(cfg.state_dir).stop(f"slurmd-{node}")
    kill_sessions(sessions_holding(cfg.spool_dir / node))


def power_on(cfg: SandboxConfig, node: str) -> None:
    """The machine's slurmd, when slurm.conf lists the node (else the machine only boots:
    a slurmd for an undeclared node would exit at once)."""
    table = ProcessTable(cfg.state_dir)
    if node in listed_nodes(cfg) and not table.alive(f"slurmd-{node}"):
        table.spawn(f"slurmd-{node}", daemons.slurmd_argv(cfg, node), daemons.slurm_env(cfg))


def start_agent(cfg: SandboxConfig, node: str, *, new_machine: bool = False) -> None:
    """The machine's health agent (a DaemonSet pod on a real node) starts with it: it
    reports to the API from the first boot, which the provisioning's health gate needs.

    `new_machine`: a machine created for the node (a replacement, a scale up) has a disk
    of its own: its agent starts without the memory of the machine it replaces (which
    would take the old machine's fault as still firing and never report it)."""
    if not (cfg.state_dir / "api" / "token").exists():
        return  # no API to report to: the emulator runs without the sandbox (its own tests)
    table = ProcessTable(cfg.state_dir)
    if new_machine:
        forget_old_machine(cfg, node)
    if not cfg.agent_file(node).exists():  # a node beyond the sandbox's own (a scale up)
        cfg.agent_file(node).parent.mkdir(parents=True, exist_ok=True)
        fake_backend.write_node(cfg.agent_file(node), fake_backend.healthy_node())
    if not table.alive(f"agent-{node}"):
        table.spawn(f"agent-{node}", daemons.agent_argv(cfg, node), daemons.agent_env(cfg))
    agent_targets.add(cfg, node)  # Prometheus scrapes it from now on


def forget_old_machine(cfg: SandboxConfig, node: str) -> bool:
    """Drop the agent memory a deleted machine left under the node's name; False (nothing
    dropped) while an agent still runs on it: its files are in use."""
    if ProcessTable(cfg.state_dir).alive(f"agent-{node}"):
        return False
    shutil.rmtree(cfg.agent_spool(node), ignore_errors=True)
    return True


def stop_agent(cfg: SandboxConfig, node: str) -> None:
    agent_targets.remove(cfg, node)  # a deleted machine's agent is no scrape target
    ProcessTable(cfg.state_dir).stop(f"agent-{node}")


def _pool_labels(vm: EmulatedVm) -> dict[str, str]:
    labels = (vm.model_extra or {}).get("node_labels") or {}
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def provider_id(vm_id: str) -> str:
    return f"crusoe://{vm_id}"


# How long an emulated kubelet keeps trying to register while the API server is away.
KUBELET_PATIENCE_S = 300.0


class SandboxMachines:
    """VmBackend for the Crusoe emulator (`--backend sandbox.machines.backend:SandboxMachines
    --backend-arg <state dir>`)."""

    def __init__(self, state_dir: str | Path) -> None:
        self._cfg = SandboxConfig.load(Path(state_dir))
        self._vms = VmRegistry(self._cfg.state_dir)
        self._vms.dir.mkdir(parents=True, exist_ok=True)
        self._hardware = Hardware(self._cfg.state_dir)
        self._slurm = ManagedSlurm(self._cfg, power_on)

    async def _register_node(self, vm: EmulatedVm) -> None:
        """The machine's kubelet registers (a new bootID each boot). A new machine joins
        the training pool (`--node-labels`, `--register-with-taints`: inference pods never
        land on it until it is lent); the device plugin advertises its GPUs."""
        if not self._cfg.k8s:
            return
        # Like a real kubelet, keep trying while the API server is away (an outage must not
        # fail the machine's boot, which is the cloud's operation, not Kubernetes').
        deadline = time.monotonic() + KUBELET_PATIENCE_S
        while True:
            try:
                await self._register_once(vm)
                return
            except (httpx.TransportError, httpx.HTTPStatusError) as e:
                status = e.response.status_code if isinstance(e, httpx.HTTPStatusError) else 0
                if (0 < status < 500) or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)

    async def _register_once(self, vm: EmulatedVm) -> None:
        async with httpx.AsyncClient(
            base_url=self._cfg.k8s_url, timeout=10, verify=self._cfg.k8s_tls()
        ) as k8s:
            r = await k8s.post(
                "/_emulator/nodes",
                json={
                    "name": vm.name,
                    "provider_id": provider_id(vm.id),
                    "boot_id": str(uuid.uuid4()),
                    "labels": {
                        # A pool VM's Node carries its pool's node_labels (what a NodeSet's
                        # node selector matches, on CMK).
                        **_pool_labels(vm),
                        INSTANCE_ID_LABEL: vm.id,
                        "nvidia.com/gpu.present": "true",
                        # Its rack and NVLink clique (systemic incidents by rack, by NVLink domain).
                        **rack_labels(self._node(vm)),
                    },
                    "register_labels": {POOL_LABEL: "training"},
                    "register_taints": [
                        {"key": POOL_TAINT_KEY, "value": "training", "effect": "NoSchedule"}
                    ],
                    "gpus": GPUS_PER_NODE,
                    "ready": True,
                },
            )
            r.raise_for_status()
            # Its slurmd pod comes from the Slinky operator (the `slinky-operator` process).

    def _node(self, vm: EmulatedVm) -> str:
        """The VM's Slurm node: what its slurmd, agent and faults go by (on CMK, not the
        VM's name: sandbox/machines/names.py)."""
        return machine_names.slurm_node(self._cfg, vm.name)

    async def _boot_slurmd(self, node: str) -> None:
        """On Managed Slurm the machine starts its slurmd; on CMK the slurmd is a pod, which
        the emulated kubelet starts once the machine's Node is Ready again."""
        if not self._cfg.cmk:
            await asyncio.to_thread(power_on, self._cfg, node)

    async def _node_down(self, vm: EmulatedVm) -> None:
        """On CMK a machine that goes down takes its Node NotReady: the kubelet runs nothing
        there (it would restart the slurmd power_off just stopped) until the boot registers
        it again."""
        if not self._cfg.cmk:
            return
        async with httpx.AsyncClient(
            base_url=self._cfg.k8s_url, timeout=10, verify=self._cfg.k8s_tls()
        ) as k8s:
            r = await k8s.post(
                f"/_emulator/nodes/{vm.name}/ready",
                json={"ready": False, "reason": "KubeletNotReady", "message": "machine down"},
            )
            if r.status_code != 404:  # no Node yet: nothing to take down
                r.raise_for_status()

    async def on_create(self, vm: EmulatedVm) -> None:
        rec = self._vms.get(vm.name) or VmRecord(node=vm.name, vm_id=vm.id)
        rec.vm_id = vm.id
        self._vms.save(rec)
        node = self._node(vm)
        self._hardware.repaired(node, vm.id, Rung.REPLACE)  # a new machine: no faults
        await asyncio.to_thread(fault_effects.lift, self._cfg, node)  # nor their effects
        await self._boot_slurmd(node)
        if not self._cfg.cmk:
            # On CMK the agent runs beside the Node's slurmd pod, under its Slurm node's name
            # (sandbox/slinky/kubelet.py), started afresh on the new Node.
            await asyncio.to_thread(start_agent, self._cfg, node, new_machine=True)
        await self._register_node(vm)

    async def on_reset(self, vm: EmulatedVm) -> None:
        node = self._node(vm)
        await self._node_down(vm)
        await asyncio.to_thread(power_off, self._cfg, node)
        await asyncio.sleep(self._cfg.boot_delay_s)
        self._hardware.repaired(node, vm.id, Rung.REBOOT)
        await asyncio.to_thread(fault_effects.lift, self._cfg, node)  # hung ranks, silence
        await self._boot_slurmd(node)
        await self._register_node(vm)

    async def on_stop(self, vm: EmulatedVm) -> None:
        await self._node_down(vm)
        await asyncio.to_thread(power_off, self._cfg, self._node(vm))

    async def on_start(self, vm: EmulatedVm) -> None:
        await self._boot_slurmd(self._node(vm))
        await self._register_node(vm)

    async def on_delete(self, vm: EmulatedVm) -> None:
        node = self._node(vm)
        await asyncio.to_thread(power_off, self._cfg, node)
        await asyncio.to_thread(stop_agent, self._cfg, node)
        if self._cfg.k8s:
            async with httpx.AsyncClient(
                base_url=self._cfg.k8s_url, timeout=10, verify=self._cfg.k8s_tls()
            ) as k8s:
                await k8s.delete(f"/_emulator/nodes/{vm.name}")

    # --- Managed Slurm (SlurmBackend) -------------------------------------------------------

    async def on_cluster_create(self, cluster: SlurmCluster) -> ClusterStarted:
        return await asyncio.to_thread(
            self._slurm.create, cluster.id, cluster.accounting_enabled, cluster.root_ssh_pub_keys
        )

    async def on_cluster_configure(
        self, cluster: SlurmCluster, running: list[str]
    ) -> ClusterStarted:
        assert cluster.configuration is not None
        return await asyncio.to_thread(
            self._slurm.configure, cluster.configuration, cluster.accounting_enabled, running
        )

    async def on_cluster_user(self, cluster: SlurmCluster, user: SlurmUser) -> None:
        await asyncio.to_thread(self._slurm.add_user, user, cluster.accounting_enabled)

    async def on_cluster_delete(self, cluster: SlurmCluster) -> None:
        await asyncio.to_thread(self._slurm.delete)


SLURM_NAMESPACE = "slurm"
NODESET = "gpu"
