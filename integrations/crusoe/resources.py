"""The Crusoe API v1 resources AutoClusters reads: VMs, node pools and async operations.

Only the fields we use are typed; the rest are kept (`extra="allow"`), so a VM's spec can be
copied into a create request and newer API fields do not break parsing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["NodePool", "Operation", "OperationKind", "OperationState", "Vm"]

OperationState = Literal["IN_PROGRESS", "SUCCEEDED", "FAILED"]
# Which `.../operations/{id}` endpoint polls an operation: each API family has its own.
OperationKind = Literal["vm", "node_pool", "autocluster"]


class Vm(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    name: str
    state: str = ""  # RUNNING, SHUTOFF, ...
    type: str = ""
    location: str = ""
    created_at: str = ""


class NodePool(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    name: str = ""
    cluster_id: str = ""
    count: int = 0
    state: str = ""
    instance_ids: list[str] = Field(default_factory=list)


class Operation(BaseModel):
    model_config = ConfigDict(extra="allow")

    operation_id: str
    state: OperationState | str = "IN_PROGRESS"
    started_at: str = ""
    completed_at: str = ""
    metadata: Any = None
    result: Any = None

    @property
    def done(self) -> bool:
        return self.state != "IN_PROGRESS"

    def failure_message(self) -> str:
        """What a FAILED operation's `result` says (`{code, message}`), or its raw result."""
        if isinstance(self.result, dict):
            message = self.result.get("message") or self.result.get("code")
            if message:
                return str(message)
        return str(self.result) if self.result else "no message"
