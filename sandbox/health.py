"""The sandbox's health gate: the checks a node must pass before it takes jobs again."""

from __future__ import annotations

from pathlib import Path

from autoclusters.core.models import HealthCheck, HealthReport
from autoclusters.integrations.health import gres_gpus
from autoclusters.integrations.slurm import SlurmClient
from autoclusters.sandbox.config import GPUS_PER_NODE
from autoclusters.sandbox.hardware import Hardware
from autoclusters.sandbox.vms import VmRegistry


class SandboxHealth:
    def __init__(self, state_dir: Path, slurm: SlurmClient) -> None:
        self._vms = VmRegistry(state_dir)
        self._hardware = Hardware(state_dir)
        self._slurm = slurm

    async def check(self, node: str) -> HealthReport:
        checks: list[HealthCheck] = []
        n = await self._slurm.node(node)
        checks.append(
            HealthCheck(
                name="slurmd",
                passed=n is not None and n.responding,
                detail=n.display_state if n else "not in Slurm",
            )
        )
        gpus = gres_gpus(n.gres) if n else 0
        checks.append(
            HealthCheck(
                name="gpu_count",
                passed=gpus == GPUS_PER_NODE,
                detail=f"{gpus} of {GPUS_PER_NODE} GPUs",
            )
        )
        vm = self._vms.get(node)
        faults = self._hardware.faults(node, vm.vm_id) if vm else []
        checks.append(
            HealthCheck(
                name="gpu_faults",
                passed=not faults,
                detail=", ".join(f.fault for f in faults) or "none",
            )
        )
        return HealthReport(node=node, passed=all(c.passed for c in checks), checks=checks)
