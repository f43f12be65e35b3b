"""The cloud provider interface: how a node's machine is reset, rebooted or replaced.

Implementations: `sandbox.cloud.SandboxCloud` (local slurmd processes stand in for VMs).
The Crusoe Cloud provider arrives with the Crusoe API work.
"""

from __future__ import annotations

from typing import Protocol

from autoclusters.core.models import RepairResult, ReplaceResult
from autoclusters.core.policy import Rung


class CloudError(RuntimeError):
    """The provider refused or failed an operation.

    `non_retryable`: asking again cannot help (a 400, bad credentials, an unknown VM).
    """

    non_retryable: bool = False


class CloudProvider(Protocol):
    async def vm_id(self, node: str) -> str:
        """The id of the machine currently behind `node`."""
        ...

    async def repair(self, node: str, rung: Rung, idempotency_key: str) -> RepairResult:
        """Reset the node's GPUs, reboot its machine, or replace the machine.

        The same key never repairs twice: a retried call returns the first call's result.
        """
        ...

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        """Swap the node's machine for a fresh one (the first runbook's single repair)."""
        ...
