"""Simulated hardware faults of sandbox machines.

A fault sits on one VM and records the cheapest repair that clears it: a GPU reset clears
what `fixed_by: reset_gpu` says, a reboot also clears `reboot` faults, and a replacement is
a new machine with no faults at all. The machine's agent (fake backend) sees what is
left, and the health gate hears it from the agent.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, Field

from autoclusters.clients.agent import fake_backend
from autoclusters.core.policy import LADDER, Rung


class HardwareFault(BaseModel):
    fault: str
    fixed_by: Rung = Rung.REBOOT


class MachineFaults(BaseModel):
    vm_id: str
    faults: list[HardwareFault] = Field(default_factory=list)


class Hardware:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "hardware"

    def _path(self, node: str) -> Path:
        return self.dir / f"{node}.json"

    def faults(self, node: str, vm_id: str) -> list[HardwareFault]:
        try:
            rec = MachineFaults.model_validate_json(self._path(node).read_text())
        except FileNotFoundError:
            return []
        return rec.faults if rec.vm_id == vm_id else []  # a new machine has none

    def agent_file(self, node: str) -> Path:
        """What the node's health agent (fake backend) reads as the machine's GPUs."""
        return self.dir.parent / "agent" / f"{node}.json"

    def inject(
        self, node: str, vm_id: str, fault: HardwareFault, *, at: datetime | None = None
    ) -> None:
        """`at`: when the fault struck (the Xid's stamp); None: now."""
        rec = MachineFaults(vm_id=vm_id, faults=[*self.faults(node, vm_id), fault])
        self._save(node, rec)
        # The node's agent sees it as NVML would report it (if an agent can see it at all).
        path = self.agent_file(node)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(fake_backend.UnknownFault):
            fake_backend.inject(path, fault=fault.fault, now=at)

    def repaired(self, node: str, vm_id: str, rung: Rung) -> None:
        """What `rung` clears on this machine is gone (a new machine has no faults)."""
        left = [
            f for f in self.faults(node, vm_id) if LADDER.index(f.fixed_by) > LADDER.index(rung)
        ]
        self._save(node, MachineFaults(vm_id=vm_id, faults=left))
        path = self.agent_file(node)
        if not path.exists():
            return
        if rung in (Rung.REBOOT, Rung.REPLACE):
            # The machine boots again (a new boot id): what is left shows to its agent anew.
            fake_backend.boot(path, healthy=not left, still_broken=[f.fault for f in left])
        elif not left:
            fake_backend.reset(path)

    def _save(self, node: str, rec: MachineFaults) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self._path(node).with_suffix(".tmp")
        tmp.write_text(rec.model_dump_json())
        tmp.replace(self._path(node))
