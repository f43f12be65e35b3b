"""Cloud steps of the runbook: record the machine to repair, then repair it.

`plan_repair` puts the node's VM id (and when) into the workflow's history; `repair_node`
repairs that VM only, and keeps the repair's progress (its cloud operation ids) in its
heartbeat details, so a retry on any worker resumes the same operation. The cloud API not
answering reaches the workflow as its own outage type (`CrusoeUnavailable`), not as a
`CloudError`.

The steps are given a Slurm node and hand the provider that node's machine
(activities/machine_of.py): on Managed Slurm the VM of the same name; on CMK the VM of the
Node that carries the Slurm node's name (its id read off the Node). A replacement is written
into the slot ledger, where the cluster keeps one. Reading the cluster for it is a Kubernetes
call: one that fails is an outage (`KubernetesUnavailable`), never "no such machine".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.heartbeat import heartbeating
from autoclusters.core.models import (
    PlanRepairInput,
    RepairInput,
    RepairPlan,
    RepairResult,
    ReplaceInput,
    ReplaceResult,
)
from autoclusters.core.policy import Rung
from autoclusters.core.unavailable import UNAVAILABLE, Unavailable, is_unavailable_type
from autoclusters.integrations.cloud import CloudError, CloudProvider


class Machines(Protocol):
    """Which VM a Slurm node is, and where a replacement is recorded: `MachineOf`
    (activities/machine_of.py), which reads the cluster's Kubernetes API. Its failures reach
    the step as the workflow reads them (an outage stays retryable). Typed here, not
    imported: the cloud steps load no Kubernetes client (cluster providers use this module)."""

    async def vm_of(self, node: str) -> tuple[str, str]:
        """(the VM's name, its id or "" to find it by that name)."""
        ...

    async def record_replacement(self, node: str, old_vm_id: str, new_vm_id: str) -> None: ...


class CloudActivities:
    """The runbook's cloud steps. `machines`: how a Slurm node's VM is found (None: the VM of
    the same name, with no Kubernetes to read)."""

    def __init__(
        self,
        provider: CloudProvider,
        heartbeat_s: float = 2.0,
        *,
        machines: Machines | None = None,
    ) -> None:
        self._provider = provider
        self._heartbeat_s = heartbeat_s
        self._machines = machines

    async def _vm_of(self, node: str) -> tuple[str, str]:
        if self._machines is None:
            return node, ""
        return await self._machines.vm_of(node)

    async def _replaced(self, node: str, old_vm_id: str, new_vm_id: str) -> None:
        """The slot ledger learns the new machine (where the cluster keeps one)."""
        if self._machines is not None and old_vm_id != new_vm_id:
            await self._machines.record_replacement(node, old_vm_id, new_vm_id)

    @activity.defn(name="plan_repair")
    async def plan_repair(self, inp: PlanRepairInput) -> RepairPlan:
        """The VM the repair is about, and when it was planned (taken first)."""
        planned_at = time.time()
        try:
            async with heartbeating(f"finding the machine of {inp.node}"):
                vm_name, vm_id = await self._vm_of(inp.node)
                vm_id = vm_id or await self._provider.vm_id(vm_name)
                spec = {}
                if inp.rung == Rung.REPLACE:
                    spec = await self._provider.machine_spec(vm_name, vm_id)
        except CloudError as e:
            raise cloud_failure(e) from e
        return RepairPlan(node=inp.node, vm_id=vm_id, planned_at=planned_at, machine_spec=spec)

    @activity.defn(name="repair_node")
    async def repair_node(self, inp: RepairInput) -> RepairResult:
        details = activity.info().heartbeat_details
        progress = details[0] if details and isinstance(details[0], dict) else None
        vm_name, _ = await self._vm_of(inp.node)
        async with self._heartbeating(f"{inp.rung.value} {inp.node}", progress) as record:
            done = await self._provider.repair(
                vm_name,
                inp.rung,
                idempotency_key=inp.key,
                vm_id=inp.vm_id,
                planned_at=inp.planned_at,
                machine_spec=inp.machine_spec or None,
                progress=progress,
                on_progress=record,
            )
        await self._replaced(inp.node, done.old_vm_id, done.new_vm_id)
        return done.model_copy(update={"node": inp.node})

    @activity.defn(name="replace_node")
    async def replace_node(self, inp: ReplaceInput) -> ReplaceResult:
        """The first runbook's repair; kept for incidents started under it."""
        vm_name, _ = await self._vm_of(inp.node)
        async with self._heartbeating(f"replacing {inp.node}"):
            done = await self._provider.replace(vm_name, idempotency_key=inp.incident_id)
        await self._replaced(inp.node, done.old_vm_id, done.new_vm_id)
        return done.model_copy(update={"node": inp.node})

    @contextlib.asynccontextmanager
    async def _heartbeating(
        self, what: str, progress: dict[str, Any] | None = None
    ) -> AsyncIterator[Callable[[dict[str, Any]], None]]:
        """Heartbeat the repair's latest progress (or `what`, before there is any) every
        `heartbeat_s`, and at once whenever it changes: a dead worker is noticed in seconds,
        the workflow can cancel the repair, and a retry reads the progress back."""
        latest: list[Any] = [progress if progress is not None else what]

        def record(details: dict[str, Any]) -> None:
            latest[0] = details
            activity.heartbeat(details)

        async def beat() -> None:
            while True:
                activity.heartbeat(latest[0])
                await asyncio.sleep(self._heartbeat_s)

        beater = asyncio.create_task(beat())
        try:
            yield record
        except CloudError as e:
            raise cloud_failure(e) from e
        finally:
            beater.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beater


def cloud_failure(e: CloudError) -> ApplicationError:
    """A cloud error as the workflow reads it. The cloud API not answering
    (`CrusoeUnavailable`, any `Unavailable`) keeps its own type, which ends in
    "Unavailable": an outage, retryable, that the workflow waits out; anything else is a
    `CloudError`, retryable unless the provider said a retry cannot help."""
    if isinstance(e, Unavailable):
        name = type(e).__name__
        return ApplicationError(
            str(e), type=name if is_unavailable_type(name) else UNAVAILABLE, non_retryable=False
        )
    return ApplicationError(
        str(e), type="CloudError", non_retryable=getattr(e, "non_retryable", False)
    )
