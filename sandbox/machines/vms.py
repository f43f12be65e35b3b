"""Which "VM" stands behind each sandbox node, and the repair operations done on it.

One JSON file per node under <state>/vms/. An operation is recorded before it starts,
keyed by the caller's idempotency key, so a retried repair resumes the same operation
instead of repairing (or replacing) a second time.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from autoclusters.core.policy import Rung


class Operation(BaseModel):
    key: str
    kind: Rung = Rung.REPLACE
    old_vm_id: str
    new_vm_id: str  # the same id for a reset or a reboot
    stopped_at: float | None = None
    state: Literal["IN_PROGRESS", "SUCCEEDED"] = "IN_PROGRESS"


class VmRecord(BaseModel):
    node: str
    vm_id: str
    operations: dict[str, Operation] = Field(default_factory=dict)


def new_vm_id() -> str:
    return str(uuid.uuid4())


class VmRegistry:
    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "vms"

    def _path(self, node: str) -> Path:
        return self.dir / f"{node}.json"

    def reset(self, nodes: list[str]) -> None:
        """A fresh sandbox: every node gets a first VM."""
        self.dir.mkdir(parents=True, exist_ok=True)
        for p in self.dir.glob("*.json"):
            p.unlink()
        for node in nodes:
            self.save(VmRecord(node=node, vm_id=new_vm_id()))

    def get(self, node: str) -> VmRecord | None:
        try:
            return VmRecord.model_validate_json(self._path(node).read_text())
        except FileNotFoundError:
            return None

    def save(self, rec: VmRecord) -> None:
        tmp = self._path(rec.node).with_suffix(".tmp")
        tmp.write_text(rec.model_dump_json(indent=2))
        tmp.replace(self._path(rec.node))
