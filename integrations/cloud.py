"""The cloud provider interface: how a node's machine is reset, rebooted or replaced.

Implementation: `integrations.crusoe.CrusoeCloud` (the sandbox runs it against its Crusoe
Cloud API emulator, whose VMs are the sandbox's slurmd processes).

`node` below names the machine as the cloud knows it: the VM's name. On Managed Slurm that
is the Slurm node's own name; on Slurm as Slinky on CMK it is the Node's (and its VM's) name,
which the cloud steps find from the Slurm node (activities/machine_of.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

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

    async def machine_spec(self, node: str, vm_id: str) -> dict[str, Any]:
        """What recreating `node`'s machine `vm_id` (the one `vm_id()` gave) needs, read
        before a replace deletes it ({}: the cloud replaces machines itself)."""
        ...

    async def repair(
        self,
        node: str,
        rung: Rung,
        idempotency_key: str,
        *,
        vm_id: str | None = None,
        planned_at: float | None = None,
        machine_spec: Mapping[str, Any] | None = None,
        progress: Mapping[str, Any] | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> RepairResult:
        """Reset the node's GPUs, reboot its machine, or replace the machine.

        `vm_id`, `planned_at`: the machine recorded by the plan (only that one is acted on)
        and when. `on_progress` gets the repair's progress (operation ids) after each step;
        a retry passes the last of it back as `progress` and resumes, never repairing twice.
        """
        ...

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        """Swap the node's machine for a fresh one (the first runbook's single repair)."""
        ...
