"""CloudProvider on Crusoe Cloud: a Slurm node is the VM of the same name.

- reset_gpu, reboot: `PATCH {"action": "RESET"}` on the VM (START if it is stopped). Crusoe
  has no per-GPU reset in its API (a GPU reset would run on the node itself, through
  nvidia-smi), so both rungs power-cycle the VM; the machine goes down, which `stopped_at`
  records.
- replace, in the first way that applies:
  1. a CMK cluster with AutoClusters (`cluster_id`): `POST .../autoclusters/vms/{id}/remediate`;
  2. the VM is in one of the managed node pools given (`node_pool_ids`): delete it, and the
     pool creates a replacement;
  3. otherwise: delete it and create a VM from its spec (name, type, location, image, ...).
  Done when a RUNNING VM with the node's name and a new id exists.

Idempotency: each repair is recorded under its key before anything is sent (in memory, and
in `journal` when given, so a restarted worker remembers too), with the old VM's id and the
operations it started. A retried call resumes the recorded operations, and reads the remote
state first: once the node's name belongs to a VM other than the recorded old one, the
replacement happened and is never done a second time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from autoclusters.core.models import RepairResult, ReplaceResult
from autoclusters.core.policy import Rung
from autoclusters.integrations.crusoe.client import CrusoeClient
from autoclusters.integrations.crusoe.errors import (
    CrusoeError,
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeTimeout,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.resources import Operation, OperationKind, Vm

__all__ = ["CrusoeCloud", "RepairAttempt"]

log = logging.getLogger(__name__)

Route = Literal["reset", "remediate", "node_pool", "recreate"]
# A VM in one of these states is down already: "resetting" it means starting it.
_STOPPED_STATES = frozenset({"SHUTOFF", "SHUTDOWN", "STOPPED", "CRASHED"})
# Fields of an existing VM worth carrying into the request that recreates it.
_SPEC_FIELDS = (
    "image",
    "custom_image",
    "ssh_public_key",
    "startup_script",
    "shutdown_script",
    "maintenance_policy",
    "nvlink_domain_id",
)


class RepairAttempt(BaseModel):
    """One repair, recorded under its idempotency key before the first request is sent."""

    key: str
    node: str
    rung: Rung
    route: Route
    action: Literal["RESET", "START"] = "RESET"  # route reset: a stopped VM is started instead
    old_vm_id: str
    node_pool_id: str | None = None
    spec: dict[str, Any] = Field(default_factory=dict)  # to recreate the VM (route recreate)
    operation_id: str | None = None  # reset, remediate or delete
    create_operation_id: str | None = None
    stopped_at: float | None = None
    new_vm_id: str | None = None
    done: bool = False


def _not_a_repair(rung: Rung) -> CrusoeError:
    error = CrusoeError(f"{rung.value} is not a repair")
    error.non_retryable = True
    return error


class CrusoeCloud:
    """Repairs nodes through the Crusoe API.

    Args:
        client: a `CrusoeClient` for the cluster's project.
        cluster_id: the CMK cluster with the AutoClusters add-on; replace then goes through
            AutoClusters remediation.
        node_pool_ids: managed node pools whose VMs the pool itself replaces when deleted.
        create_defaults: merged into a recreated VM's request (an ssh key, a startup script:
            what the API does not return about a VM).
        operation_timeout_s: the longest one async operation may take.
        replace_timeout_s: the longest a replacement may take to be RUNNING (default: inside
            the repair activity's default 900 s, so the activity fails with our message).
        poll_s: how often operations and VM lists are polled; None: the client's.
        journal: a JSON file of repair attempts, so a restarted worker resumes them.
    """

    def __init__(
        self,
        client: CrusoeClient,
        *,
        cluster_id: str | None = None,
        node_pool_ids: Sequence[str] = (),
        create_defaults: Mapping[str, Any] | None = None,
        operation_timeout_s: float = 600.0,
        replace_timeout_s: float = 840.0,
        poll_s: float | None = None,
        journal: Path | None = None,
    ) -> None:
        self._client = client
        self._cluster_id = cluster_id
        self._node_pool_ids = list(node_pool_ids)
        self._create_defaults = dict(create_defaults or {})
        self._operation_timeout_s = operation_timeout_s
        self._replace_timeout_s = replace_timeout_s
        self._poll_s = client.poll_s if poll_s is None else poll_s
        self._journal = journal
        self._attempts: dict[str, RepairAttempt] = self._load_journal()
        self._vm_ids: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def aclose(self) -> None:
        """Close the client (the worker calls this when it stops)."""
        await self._client.aclose()

    # --- CloudProvider --------------------------------------------------------------------

    async def vm_id(self, node: str) -> str:
        if node not in self._vm_ids:
            self._vm_ids[node] = (await self._current_vm(node)).id
        return self._vm_ids[node]

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        done = await self.repair(node, Rung.REPLACE, idempotency_key)
        return ReplaceResult(
            node=node,
            old_vm_id=done.old_vm_id,
            new_vm_id=done.new_vm_id,
            stopped_at=done.stopped_at if done.stopped_at is not None else time.time(),
        )

    async def repair(self, node: str, rung: Rung, idempotency_key: str) -> RepairResult:
        if rung == Rung.MONITOR:
            raise _not_a_repair(rung)
        async with self._locks.setdefault(node, asyncio.Lock()):
            att = self._attempts.get(idempotency_key)
            if att is None:
                att = await self._plan(node, rung, idempotency_key)
            if not att.done:
                if att.route == "reset":
                    await self._reset(att)
                else:
                    await self._replace(att)
                att.done = True
                self._record(att)
            assert att.new_vm_id is not None
            self._vm_ids[node] = att.new_vm_id
            return RepairResult(
                node=node,
                rung=att.rung,
                old_vm_id=att.old_vm_id,
                new_vm_id=att.new_vm_id,
                stopped_at=att.stopped_at,
            )

    # --- planning -------------------------------------------------------------------------

    async def _current_vm(self, node: str) -> Vm:
        vm = await self._client.find_vm_by_name(node)
        if vm is None:
            raise CrusoeError(f"no Crusoe VM named {node} in project {self._client.project_id}")
        return vm

    async def _plan(self, node: str, rung: Rung, key: str) -> RepairAttempt:
        vm = await self._current_vm(node)  # fresh: the cache may predate someone else's repair
        route: Route = "reset"
        pool_id: str | None = None
        if rung == Rung.REPLACE:
            if self._cluster_id:
                route = "remediate"
            else:
                pool_id = await self._pool_of(vm)
                route = "node_pool" if pool_id else "recreate"
        att = RepairAttempt(
            key=key,
            node=node,
            rung=rung,
            route=route,
            action="START" if vm.state in _STOPPED_STATES else "RESET",
            old_vm_id=vm.id,
            node_pool_id=pool_id,
            spec=self._spec_of(vm) if route == "recreate" else {},
        )
        self._record(att)
        log.info("crusoe %s of %s (VM %s) planned as %s, key %s", rung, node, vm.id, route, key)
        return att

    async def _pool_of(self, vm: Vm) -> str | None:
        for pool_id in self._node_pool_ids:
            if vm.id in (await self._client.get_node_pool(pool_id)).instance_ids:
                return pool_id
        return None

    def _spec_of(self, vm: Vm) -> dict[str, Any]:
        extra = vm.model_extra or {}
        spec: dict[str, Any] = {"name": vm.name, "type": vm.type, "location": vm.location}
        spec |= {f: extra[f] for f in _SPEC_FIELDS if extra.get(f)}
        hcas = [h for h in extra.get("host_channel_adapters") or [] if isinstance(h, dict)]
        if any(h.get("ib_partition_id") for h in hcas):
            spec["host_channel_adapters"] = [
                {"ib_partition_id": h["ib_partition_id"]} for h in hcas if h.get("ib_partition_id")
            ]
        return spec | self._create_defaults

    # --- the rungs ------------------------------------------------------------------------

    async def _reset(self, att: RepairAttempt) -> None:
        vm_id, action = att.old_vm_id, att.action
        await self._run_operation(
            att, "operation_id", "vm", lambda: self._client.patch_vm_action(vm_id, action)
        )
        att.new_vm_id = att.old_vm_id

    async def _replace(self, att: RepairAttempt) -> None:
        if att.route == "remediate":
            assert self._cluster_id is not None
            cluster = self._cluster_id
            await self._take_down(
                att, "autocluster", lambda: self._client.remediate_vm(cluster, att.old_vm_id)
            )
        else:
            await self._take_down(att, "vm", lambda: self._client.delete_vm(att.old_vm_id))
            if att.route == "recreate" and await self._client.find_vm_by_name(att.node) is None:
                await self._run_operation(
                    att,
                    "create_operation_id",
                    "vm",
                    lambda: self._client.create_vm(att.spec),
                    marks_stop=False,
                )
        new = await self._wait_replacement(att)
        att.new_vm_id = new.id
        if att.stopped_at is None:  # replaced before a worker restart that lost the record
            att.stopped_at = time.time()
        log.info("crusoe replaced %s: VM %s -> %s", att.node, att.old_vm_id, new.id)

    async def _take_down(
        self, att: RepairAttempt, kind: OperationKind, submit: Callable[[], Awaitable[Operation]]
    ) -> None:
        """Remediate or delete the old VM, unless it is gone already.

        A try whose answer was lost (the worker died mid-request) leaves an operation we did
        not record: a second request then meets 409 while it runs and 404 once the VM is
        gone. Both mean "wait and look again", never "replace again".
        """
        deadline = time.monotonic() + self._operation_timeout_s
        while True:
            current = await self._client.find_vm_by_name(att.node)
            if current is None or current.id != att.old_vm_id:
                return
            try:
                await self._run_operation(att, "operation_id", kind, submit)
                return
            except CrusoeNotFound:
                # Gone meanwhile, or the 404 is about something else (a wrong cluster id).
                again = await self._client.find_vm_by_name(att.node)
                if again is not None and again.id == att.old_vm_id:
                    raise
                return
            except CrusoeUnavailable as e:
                if e.status != 409 or time.monotonic() >= deadline:
                    raise
                log.info("crusoe VM %s is busy; waiting to replace it", att.old_vm_id)
            await asyncio.sleep(self._poll_s)

    async def _run_operation(
        self,
        att: RepairAttempt,
        field: Literal["operation_id", "create_operation_id"],
        kind: OperationKind,
        submit: Callable[[], Awaitable[Operation]],
        *,
        marks_stop: bool = True,
    ) -> None:
        """Resume the operation recorded in `field`, or submit one and record it first."""
        op: Operation | None = None
        recorded = getattr(att, field)
        if recorded:
            try:
                op = await self._client.get_operation(recorded, kind)
            except CrusoeNotFound:
                op = None
        if op is None:
            if marks_stop:
                att.stopped_at = time.time()  # the machine goes down from this request on
            op = await submit()
            setattr(att, field, op.operation_id)
            self._record(att)
        try:
            await self._client.wait_operation(
                op, kind, poll_s=self._poll_s, timeout_s=self._operation_timeout_s
            )
        except CrusoeOperationFailed:
            # A retry submits a new operation rather than waiting on this failed one.
            setattr(att, field, None)
            self._record(att)
            raise

    async def _wait_replacement(self, att: RepairAttempt) -> Vm:
        """Until a RUNNING VM named like the node, other than the old one, exists."""
        deadline = time.monotonic() + self._replace_timeout_s
        while True:
            if att.node_pool_id is not None:
                vms = await self._client.node_pool_vms(att.node_pool_id)
            else:
                vms = await self._client.list_vms(names=[att.node])
            for vm in vms:
                if vm.name == att.node and vm.id != att.old_vm_id and vm.state == "RUNNING":
                    return vm
            if time.monotonic() >= deadline:
                raise CrusoeTimeout(
                    f"no RUNNING replacement for {att.node} (old VM {att.old_vm_id}) "
                    f"after {self._replace_timeout_s:.0f}s"
                )
            await asyncio.sleep(self._poll_s)

    # --- the record -----------------------------------------------------------------------

    def _record(self, att: RepairAttempt) -> None:
        self._attempts[att.key] = att
        if self._journal is None:
            return
        self._journal.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._journal.with_suffix(".tmp")
        data = {k: a.model_dump(mode="json") for k, a in self._attempts.items()}
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self._journal)

    def _load_journal(self) -> dict[str, RepairAttempt]:
        if self._journal is None or not self._journal.exists():
            return {}
        data = json.loads(self._journal.read_text())
        return {k: RepairAttempt.model_validate(v) for k, v in data.items()}
