"""The sandbox cloud: a node's "VM" is its slurmd process.

Replacing a VM stops that slurmd (the machine is gone), waits the boot delay, and starts a
fresh slurmd under a new VM id, which registers with slurmctld like a new machine would.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from autoclusters.cloud import CloudError
from autoclusters.models import ReplaceResult
from sandbox import daemons
from sandbox.config import SandboxConfig
from sandbox.processes import ProcessTable, kill_sessions, sessions_holding
from sandbox.vms import ReplaceOperation, VmRegistry, new_vm_id


class SandboxCloud:
    def __init__(self, state_dir: Path, boot_delay_s: float = 20.0) -> None:
        self._cfg = SandboxConfig.load(state_dir)
        self._table = ProcessTable(state_dir)
        self._vms = VmRegistry(state_dir)
        self._boot_delay_s = boot_delay_s
        # One replace at a time per node within this worker.
        self._locks: dict[str, asyncio.Lock] = {}

    async def vm_id(self, node: str) -> str:
        rec = self._vms.get(node)
        if rec is None:
            raise CloudError(f"no VM behind node {node}")
        return rec.vm_id

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        async with self._locks.setdefault(node, asyncio.Lock()):
            return await self._replace(node, idempotency_key)

    async def _replace(self, node: str, key: str) -> ReplaceResult:
        rec = self._vms.get(node)
        if rec is None:
            raise CloudError(f"no VM behind node {node}")
        op = rec.operations.get(key)
        if op is None:
            op = ReplaceOperation(key=key, old_vm_id=rec.vm_id, new_vm_id=new_vm_id())
            rec.operations[key] = op
            self._vms.save(rec)
        if op.state == "SUCCEEDED":
            return _result(node, op)

        name = f"slurmd-{node}"
        if op.stopped_at is None:
            await asyncio.to_thread(self._power_off, node)
            op.stopped_at = time.time()
            self._vms.save(rec)
        # A resumed operation only waits for what is left of the boot.
        remaining = op.stopped_at + self._boot_delay_s - time.time()
        if remaining > 0:
            await asyncio.sleep(remaining)
        if not self._table.alive(name):
            self._table.spawn(
                name, daemons.slurmd_argv(self._cfg, node), daemons.slurm_env(self._cfg)
            )
        rec.vm_id, op.state = op.new_vm_id, "SUCCEEDED"
        self._vms.save(rec)
        return _result(node, op)

    def _power_off(self, node: str) -> None:
        """The old machine disappears: its slurmd and every job step still running on it."""
        self._table.stop(f"slurmd-{node}")
        kill_sessions(sessions_holding(self._cfg.state_dir / "slurm" / "spool" / node))


def _result(node: str, op: ReplaceOperation) -> ReplaceResult:
    assert op.stopped_at is not None
    return ReplaceResult(
        node=node, old_vm_id=op.old_vm_id, new_vm_id=op.new_vm_id, stopped_at=op.stopped_at
    )
