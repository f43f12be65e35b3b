"""CloudProvider on Crusoe Cloud: the `node` it is given is the name of the machine, the VM
of that name. On Managed Slurm that is the Slurm node's own name; on CMK, where a pool names
its VMs and the Slurm node is its Node's hostname-override, the runbook's cloud steps pass
the VM's name and the id read off its Node (activities/machine_of.py), and a replacement is
the RUNNING VM of that name with a new id (as the emulator makes it; a CMK that gives the
successor another name is not followed yet).

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

Idempotency lives in the workflow's history, never on a disk: the runbook records the VM
to repair (`plan_repair`: its id and when the repair was planned) before the repair starts,
and the repair activity keeps this repair's progress (route, operation ids) in its heartbeat
details, handed to `repair` as `progress` on a retry and sent through `on_progress` after
every step. So a retry on any worker resumes the same operation and only ever acts on the
recorded VM:
- with progress: the recorded operations are resumed;
- without (the heartbeat was lost: the worker died right after the cloud call): the
  recorded VM's operations started since the plan are listed from Crusoe's own record and
  one of this repair's kind is adopted rather than a second one submitted;
- once the recorded VM is gone, the replacement happened: the VM that now has the node's
  name is the result, and it is never deleted or reset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
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

# gone: the recorded VM no longer exists (replaced already): wait for its successor only.
Route = Literal["reset", "remediate", "node_pool", "recreate", "gone"]
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
    # Which cluster and node set a provisioned machine belongs to (activities/cluster_provider):
    # a recreated machine is still that cluster's.
    "labels",
)


class RepairAttempt(BaseModel):
    """One repair's progress: what the repair activity keeps in its heartbeat details."""

    key: str
    node: str
    rung: Rung
    route: Route
    action: Literal["RESET", "START"] = "RESET"  # route reset: a stopped VM is started instead
    old_vm_id: str
    planned_at: float | None = None  # epoch s; operations on old_vm_id since then are ours
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
        clock_skew_s: how far this worker's clock may be ahead of Crusoe's when operations
            started since a plan are listed.
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
        clock_skew_s: float = 1.0,
    ) -> None:
        self._client = client
        self._cluster_id = cluster_id
        self._node_pool_ids = list(node_pool_ids)
        self._create_defaults = dict(create_defaults or {})
        self._operation_timeout_s = operation_timeout_s
        self._replace_timeout_s = replace_timeout_s
        self._poll_s = client.poll_s if poll_s is None else poll_s
        self._clock_skew_s = clock_skew_s
        self._locks: dict[str, asyncio.Lock] = {}

    async def aclose(self) -> None:
        """Close the client (the worker calls this when it stops)."""
        await self._client.aclose()

    # --- CloudProvider --------------------------------------------------------------------

    async def vm_id(self, node: str) -> str:
        """The VM that has the node's name now (read fresh: a plan records it)."""
        return (await self._current_vm(node)).id

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        done = await self.repair(node, Rung.REPLACE, idempotency_key)
        return ReplaceResult(
            node=node,
            old_vm_id=done.old_vm_id,
            new_vm_id=done.new_vm_id,
            stopped_at=done.stopped_at if done.stopped_at is not None else time.time(),
        )

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
        """Repair the node's machine: the recorded `vm_id` (None: the VM named so now).

        `progress`: what `on_progress` last reported for this key (a retry's heartbeat
        details); `on_progress` gets the repair's progress after every step.
        """
        if rung == Rung.MONITOR:
            raise _not_a_repair(rung)

        def emit(att: RepairAttempt) -> None:
            if on_progress is not None:
                on_progress(att.model_dump(mode="json"))

        async with self._locks.setdefault(node, asyncio.Lock()):
            att = None
            if progress and progress.get("key") == idempotency_key:
                att = RepairAttempt.model_validate(dict(progress))
            if att is None:
                att = await self._plan(
                    node, rung, idempotency_key, vm_id, planned_at, machine_spec or {}
                )
                emit(att)
            if not att.done:
                if att.route == "reset":
                    await self._reset(att, emit)
                else:
                    await self._replace(att, emit)
                att.done = True
                emit(att)
            assert att.new_vm_id is not None
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

    async def _recorded_vm(self, vm_id: str) -> Vm | None:
        try:
            return await self._client.get_vm(vm_id)
        except CrusoeNotFound:
            return None

    async def _plan(
        self,
        node: str,
        rung: Rung,
        key: str,
        vm_id: str | None,
        planned_at: float | None,
        machine_spec: Mapping[str, Any],
    ) -> RepairAttempt:
        if vm_id is None:  # an older runbook recorded no VM: the one named so now
            vm = await self._current_vm(node)
        else:
            found = await self._recorded_vm(vm_id)
            if found is None and self._recreates(rung, machine_spec):
                # Deleted by this repair's first attempt, whose worker died before the
                # create (and before its progress reached the server): nobody else makes
                # the successor. Create it from the spec recorded with the VM.
                log.info("crusoe VM %s of %s is gone: recreating it as recorded", vm_id, node)
                return RepairAttempt(
                    key=key, node=node, rung=rung, route="recreate", old_vm_id=vm_id,
                    planned_at=planned_at, spec=dict(machine_spec) | self._create_defaults,
                )  # fmt: skip
            if found is None:
                log.info("crusoe VM %s of %s is gone: it was replaced already", vm_id, node)
                return RepairAttempt(
                    key=key, node=node, rung=rung, route="gone", old_vm_id=vm_id,
                    planned_at=planned_at,
                )  # fmt: skip
            vm = found
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
            planned_at=planned_at,
            node_pool_id=pool_id,
            spec=self._spec_of(vm) if route == "recreate" else {},
        )
        log.info("crusoe %s of %s (VM %s) planned as %s, key %s", rung, node, vm.id, route, key)
        return att

    def _recreates(self, rung: Rung, machine_spec: Mapping[str, Any]) -> bool:
        """A replace here deletes and creates the VM itself: no AutoClusters remediation and
        no managed node pool refills it (a recorded spec means the VM was in none)."""
        return rung == Rung.REPLACE and bool(machine_spec) and not self._cluster_id

    async def machine_spec(self, node: str, vm_id: str) -> dict[str, Any]:
        """The recorded VM's own fields a recreate needs ({} where Crusoe replaces it
        itself: an AutoClusters cluster or a managed node pool; or the VM is gone already).
        Read by id: the VM the plan recorded, even if the name has moved since. The create
        defaults (keys, startup script) stay in the worker's settings, out of the history."""
        if self._cluster_id:
            return {}
        vm = await self._recorded_vm(vm_id)
        if vm is None or await self._pool_of(vm):
            return {}
        return self._own_spec(vm)

    async def _pool_of(self, vm: Vm) -> str | None:
        for pool_id in self._node_pool_ids:
            if vm.id in (await self._client.get_node_pool(pool_id)).instance_ids:
                return pool_id
        return None

    def _spec_of(self, vm: Vm) -> dict[str, Any]:
        return self._own_spec(vm) | self._create_defaults

    def _own_spec(self, vm: Vm) -> dict[str, Any]:
        extra = vm.model_extra or {}
        spec: dict[str, Any] = {"name": vm.name, "type": vm.type, "location": vm.location}
        spec |= {f: extra[f] for f in _SPEC_FIELDS if extra.get(f)}
        hcas = [h for h in extra.get("host_channel_adapters") or [] if isinstance(h, dict)]
        if any(h.get("ib_partition_id") for h in hcas):
            spec["host_channel_adapters"] = [
                {"ib_partition_id": h["ib_partition_id"]} for h in hcas if h.get("ib_partition_id")
            ]
        return spec

    # --- the rungs ------------------------------------------------------------------------

    async def _reset(self, att: RepairAttempt, emit: Emit) -> None:
        vm_id, action = att.old_vm_id, att.action
        await self._run_operation(
            att,
            emit,
            "operation_id",
            "vm",
            lambda: self._client.patch_vm_action(vm_id, action),
            adopt={"RESET", "START"},  # a retry may plan RESET after its own START ran
        )
        att.new_vm_id = att.old_vm_id

    async def _replace(self, att: RepairAttempt, emit: Emit) -> None:
        if att.route == "remediate":
            assert self._cluster_id is not None
            cluster = self._cluster_id
            await self._take_down(
                att,
                emit,
                "autocluster",
                lambda: self._client.remediate_vm(cluster, att.old_vm_id),
                adopt={"REPLACE_NODE", "REMEDIATE"},
            )
        elif att.route != "gone":
            await self._take_down(
                att, emit, "vm", lambda: self._client.delete_vm(att.old_vm_id), adopt={"DELETE"}
            )
            if att.route == "recreate" and await self._client.find_vm_by_name(att.node) is None:
                await self._run_operation(
                    att,
                    emit,
                    "create_operation_id",
                    "vm",
                    lambda: self._client.create_vm(att.spec),
                    marks_stop=False,
                )
        new = await self._wait_replacement(att)
        att.new_vm_id = new.id
        if att.stopped_at is None:  # replaced before a retry that had no record of it
            att.stopped_at = att.planned_at if att.planned_at is not None else time.time()
        log.info("crusoe replaced %s: VM %s -> %s", att.node, att.old_vm_id, new.id)

    async def _take_down(
        self,
        att: RepairAttempt,
        emit: Emit,
        kind: OperationKind,
        submit: Callable[[], Awaitable[Operation]],
        *,
        adopt: set[str],
    ) -> None:
        """Remediate or delete the recorded VM, unless it is gone already.

        Only the recorded VM is ever acted on, by its id: a VM that has the node's name now
        is a replacement. A busy VM (409: an operation runs on it) is waited for; a 404 means
        the VM went meanwhile.
        """
        deadline = time.monotonic() + self._operation_timeout_s
        while True:
            if await self._recorded_vm(att.old_vm_id) is None:
                return
            try:
                await self._run_operation(att, emit, "operation_id", kind, submit, adopt=adopt)
                return
            except CrusoeNotFound:
                # Gone meanwhile, or the 404 is about something else (a wrong cluster id).
                if await self._recorded_vm(att.old_vm_id) is not None:
                    raise
                return
            except CrusoeUnavailable as e:
                if e.status != 409 or time.monotonic() >= deadline:
                    raise
                log.info("crusoe VM %s is busy; waiting to replace it", att.old_vm_id)
            await asyncio.sleep(self._poll_s)

    async def _adoptable(
        self, att: RepairAttempt, kind: OperationKind, actions: set[str]
    ) -> Operation | None:
        """An operation of this repair on the recorded VM that a lost heartbeat forgot:
        started since the plan, of the repair's action, not FAILED."""
        if att.planned_at is None:
            return None
        since = att.planned_at - self._clock_skew_s
        ops = await self._client.list_operations(
            kind, resource_id=att.old_vm_id, since=datetime.fromtimestamp(since, UTC)
        )
        for op in ops:
            meta = op.metadata if isinstance(op.metadata, dict) else {}
            if meta.get("vm_id", att.old_vm_id) != att.old_vm_id or op.state == "FAILED":
                continue
            action = meta.get("action") or meta.get("operation_type")
            started = _epoch(op.started_at)
            if (action is None or action in actions) and (started is None or started >= since):
                log.info(
                    "crusoe %s of %s: adopting operation %s on VM %s",
                    att.rung, att.node, op.operation_id, att.old_vm_id,
                )  # fmt: skip
                return op
        return None

    async def _run_operation(
        self,
        att: RepairAttempt,
        emit: Emit,
        field: Literal["operation_id", "create_operation_id"],
        kind: OperationKind,
        submit: Callable[[], Awaitable[Operation]],
        *,
        adopt: set[str] | None = None,
        marks_stop: bool = True,
    ) -> None:
        """Resume the operation recorded in `field`, adopt this repair's operation from the
        cloud's record, or submit one; report its id at once."""
        op: Operation | None = None
        recorded = getattr(att, field)
        if recorded:
            try:
                op = await self._client.get_operation(recorded, kind)
            except CrusoeNotFound:
                op = None
        if op is None and adopt is not None:
            op = await self._adoptable(att, kind, adopt)
            if op is not None and marks_stop and att.stopped_at is None:
                att.stopped_at = _epoch(op.started_at) or att.planned_at
        if op is None:
            if marks_stop:
                att.stopped_at = time.time()  # the machine goes down from this request on
            op = await submit()
        if getattr(att, field) != op.operation_id:
            setattr(att, field, op.operation_id)
            emit(att)
        try:
            await self._client.wait_operation(
                op, kind, poll_s=self._poll_s, timeout_s=self._operation_timeout_s
            )
        except CrusoeOperationFailed:
            # A retry submits a new operation rather than waiting on this failed one.
            setattr(att, field, None)
            emit(att)
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


Emit = Callable[[RepairAttempt], None]


def _epoch(rfc3339: str) -> float | None:
    try:
        t = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo is not None else t.replace(tzinfo=UTC)).timestamp()
