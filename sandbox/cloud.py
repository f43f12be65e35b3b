"""The sandbox cloud: a node's "VM" is its slurmd process.

- reset_gpu: clears the machine's GPU-level faults; slurmd keeps running.
- reboot: slurmd and the job steps on the node stop (the machine is down), and after the
  boot delay a fresh slurmd starts on the same VM.
- replace: as a reboot, but the machine that comes back is a new VM (new id, no faults),
  which registers with slurmctld like a new machine would.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from autoclusters.core.models import RepairResult, ReplaceResult
from autoclusters.core.policy import Rung
from autoclusters.integrations.cloud import CloudError
from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.hardware import Hardware
from autoclusters.sandbox.machines import power_off, power_on
from autoclusters.sandbox.vms import Operation, VmRegistry, new_vm_id


class SandboxCloud:
    def __init__(self, state_dir: Path, boot_delay_s: float = 20.0) -> None:
        self._cfg = SandboxConfig.load(state_dir)
        self._vms = VmRegistry(state_dir)
        self._hardware = Hardware(state_dir)
        self._boot_delay_s = boot_delay_s
        # One repair at a time per node within this worker.
        self._locks: dict[str, asyncio.Lock] = {}

    async def vm_id(self, node: str) -> str:
        rec = self._vms.get(node)
        if rec is None:
            raise CloudError(f"no VM behind node {node}")
        return rec.vm_id

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        done = await self.repair(node, Rung.REPLACE, idempotency_key)
        assert done.stopped_at is not None
        return ReplaceResult(
            node=node,
            old_vm_id=done.old_vm_id,
            new_vm_id=done.new_vm_id,
            stopped_at=done.stopped_at,
        )

    async def repair(self, node: str, rung: Rung, idempotency_key: str) -> RepairResult:
        if rung == Rung.MONITOR:
            raise CloudError("monitor is not a repair")
        async with self._locks.setdefault(node, asyncio.Lock()):
            return await self._repair(node, rung, idempotency_key)

    async def _repair(self, node: str, rung: Rung, key: str) -> RepairResult:
        rec = self._vms.get(node)
        if rec is None:
            raise CloudError(f"no VM behind node {node}")
        op = rec.operations.get(key)
        if op is None:
            new_id = new_vm_id() if rung == Rung.REPLACE else rec.vm_id
            op = Operation(key=key, kind=rung, old_vm_id=rec.vm_id, new_vm_id=new_id)
            rec.operations[key] = op
            self._vms.save(rec)
        if op.state == "SUCCEEDED":
            return _result(node, op)

        if rung != Rung.RESET_GPU:
            await self._power_cycle(node, op)
            self._vms.save(rec)
        self._hardware.repaired(node, op.new_vm_id, rung)
        rec.vm_id, op.state = op.new_vm_id, "SUCCEEDED"
        self._vms.save(rec)
        return _result(node, op)

    async def _power_cycle(self, node: str, op: Operation) -> None:
        if op.stopped_at is None:
            await asyncio.to_thread(power_off, self._cfg, node)
            op.stopped_at = time.time()
        # A resumed operation only waits for what is left of the boot.
        remaining = op.stopped_at + self._boot_delay_s - time.time()
        if remaining > 0:
            await asyncio.sleep(remaining)
        power_on(self._cfg, node)


def _result(node: str, op: Operation) -> RepairResult:
    return RepairResult(
        node=node,
        rung=op.kind,
        old_vm_id=op.old_vm_id,
        new_vm_id=op.new_vm_id,
        stopped_at=op.stopped_at,
    )
