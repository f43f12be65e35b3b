"""`autoclusters chaos`: a named fault on a node (or on a random node of a running job),
and optionally one of the sandbox's processes (worker, temporal, api, slurmctld) SIGKILLed
and started again at the moment the incident's current step becomes a given step. The
incident must still finish correctly, with no step's effect applied twice: the cloud
operations are counted from the Crusoe emulator's own record, not from our side.

`repair` can be split at the cloud call: `repair:before-cloud` crashes the process while
the repair step runs but before its call reached the Crusoe emulator (the emulator holds
the repair's first request to the VM back for a few seconds, a slow API, so the crash
lands there), `repair:after-cloud` once the emulator has recorded the repair's operation
(it still runs: the repair waits for it). The report says which happened
(`killed_at_moment`, and what the emulator had recorded at the crash). With
`wipe_worker_disk`, everything the worker keeps on disk (the Slack thread store) is
deleted between the crash and the restart: the incident must not need it."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel
from rich.console import Console
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
)

from autoclusters.clients import incidents
from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState, StepRecord
from autoclusters.core.policy import Rung
from autoclusters.core.settings import load_file
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox import restart
from autoclusters.sandbox.crusoe.cloud_api import CRUSOE_EMULATOR
from autoclusters.sandbox.drivers.history_ticks import HistoryTicks
from autoclusters.sandbox.machines import fault_effects
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable
from autoclusters.workflows.remediation import NodeRemediation

# What `--kill` may crash, and the steps `--at` may name (the incident's current_step).
KILLABLE = ("worker", "temporal", "api", "slurmctld")
STEPS = (
    "drain", "requeue", "wait_idle", "repair", "wait_registered", "health_gate",
    "return_to_service",
)  # fmt: skip
BEFORE_CLOUD, AFTER_CLOUD = "before-cloud", "after-cloud"
# Where `--at` may crash something: a step, or the repair before / after its cloud call.
AT_CHOICES = (*STEPS, f"repair:{BEFORE_CLOUD}", f"repair:{AFTER_CLOUD}")
# How long the emulator holds the repair's first request back for `repair:before-cloud`.
HOLD_CLOUD_S = 5.0


class ChaosError(RuntimeError):
    pass


class ChaosReport(BaseModel):
    incident_id: str
    node: str
    fault: str
    status: str
    actions: list[str]  # what chaos did, in order
    repairs: list[str]  # rungs the incident applied, one per repair step
    # Operations on the node's machines since the incident opened (RESET, DELETE,
    # REPLACE_NODE, ...), as the Crusoe emulator recorded them performing.
    cloud_operations: int
    cloud_operation_log: list[str] = []  # "ACTION vm_id STATE", oldest first
    machine_operations: int  # the same number, under its old name
    # Where the crash really landed: the step, and for the repair whether the emulator had
    # recorded its operation yet ("repair:before-cloud" / "repair:after-cloud").
    killed_at_moment: str | None = None
    cloud_operations_at_kill: list[str] | None = None  # the emulator's record at the crash
    killed_at: datetime | None = None
    wiped: list[str] = []  # the worker's files deleted between the crash and the restart
    opened_at: datetime | None = None  # when chaos opened the incident (the fault)
    # What the crash cost in the history: activities that ran again ("drain_node attempt 2":
    # the crash caught it running) and workflow tasks that timed out on the dead worker.
    retried: list[str] = []
    steps: list[StepRecord] = []  # the incident's timeline, as it closed


def parse_at(at: str) -> tuple[str, str | None]:
    """`repair:before-cloud` -> ("repair", "before-cloud"); `drain` -> ("drain", None)."""
    if at not in AT_CHOICES:
        raise ChaosError(f"step {at!r}: expected one of {', '.join(AT_CHOICES)}")
    step, _, moment = at.partition(":")
    return step, moment or None


def worker_disk(cfg: SandboxConfig) -> list[Path]:
    """What the sandbox's worker keeps on disk: its Slack thread store (the message of
    each incident). Idempotency lives in the workflows' histories, not here."""
    settings = load_file(cfg.settings_file)
    paths = []
    if settings.slack is not None and settings.slack.store_dir is not None:
        paths.append(settings.slack.store_dir)
    return paths


def wipe_worker_disk(cfg: SandboxConfig) -> list[str]:
    """Delete what the worker keeps on disk (see `worker_disk`); say what went."""
    wiped = []
    for path in worker_disk(cfg):
        if path.is_dir():
            files = sum(1 for p in path.rglob("*") if p.is_file())
            shutil.rmtree(path)
            wiped.append(f"{path} ({files} files)")
        elif path.exists():
            path.unlink()
            wiped.append(str(path))
    return wiped


def _emulator(cfg: SandboxConfig, method: str, path: str, **kw: object) -> httpx.Response:
    url = f"http://127.0.0.1:{cfg.crusoe_port}/_emulator{path}"
    try:
        r = httpx.request(method, url, timeout=10, verify=default_verify(), **kw)  # type: ignore[arg-type]
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise ChaosError(f"the Crusoe emulator at {url}: {e}") from e
    return r


def hold_first_repair_request(cfg: SandboxConfig, node: str) -> str:
    """Make the emulator hold the next request about the node's VM (the repair's first
    look at the VM it recorded) for HOLD_CLOUD_S; return the VM id."""
    vms = _emulator(cfg, "GET", "/state").json()["vms"].values()
    ids = [vm["id"] for vm in vms if vm.get("name") == node and vm.get("state") != "DELETED"]
    if not ids:
        raise ChaosError(f"the Crusoe emulator has no VM named {node}")
    rule = {"seconds": HOLD_CLOUD_S, "count": 1, "path_contains": f"/instances/{ids[0]}"}
    _emulator(cfg, "POST", "/delay", json=rule | {"method": "GET"})
    return str(ids[0])


def _op_line(o: dict[str, object]) -> str:
    return f"{o['action']} {o['vm_id']} {o['state']}"


def cloud_operations(cfg: SandboxConfig, node: str, since: datetime) -> list[dict[str, object]]:
    """The operations the Crusoe emulator performed on `node`'s machines since `since`."""
    url = f"http://127.0.0.1:{cfg.crusoe_port}/_emulator/operations"
    params = {"vm_name": node, "since": since.isoformat()}
    try:
        r = httpx.get(url, params=params, timeout=10, verify=default_verify())
        r.raise_for_status()
    except httpx.HTTPError as e:
        raise ChaosError(f"cannot read the Crusoe emulator's operations at {url}: {e}") from e
    ops: list[dict[str, object]] = r.json()["operations"]
    return ops


async def random_job_node(slurm: SlurmCli) -> str:
    busy = sorted(
        {
            n
            for j in await slurm.jobs()
            if j.job_state == "RUNNING"
            for n in hostlist.expand(j.nodes)
        }
    )
    if not busy:
        raise ChaosError("no running job: give --node, or submit a job first")
    return random.choice(busy)


async def run_chaos(
    cfg: SandboxConfig,
    fault: str,
    node: str | None = None,
    broken_until: Rung | None = None,
    kill_worker_at: str | None = None,
    restart_temporal_at: str | None = None,
    console: Console | None = None,
    timeout_s: float = 600,
    kill: str | None = None,
    at: str | None = None,
    wipe_worker_disk_on_restart: bool = False,
    poll_s: float = 1.0,
    effect: str = "none",
) -> ChaosReport:
    """`kill` (one of KILLABLE) is SIGKILLed and started again when the incident's current
    step becomes `at` (one of AT_CHOICES). The older `kill_worker_at=STEP` is
    `kill="worker"`; `restart_temporal_at=STEP` stops the Temporal server gracefully
    (SIGTERM). `wipe_worker_disk_on_restart`: a restarted worker starts with its disk
    state deleted. The incident's status is read at each new event of its history
    (sandbox/drivers/history_ticks.py), and at least every `poll_s`. `effect`: what the fault does
    to the jobs on the node (sandbox/machines/fault_effects.py; "default": the fault's realistic
    effect), before the incident opens."""
    console = console or Console(stderr=True)
    if (kill is None) != (at is None):
        raise ChaosError("--kill and --at go together")
    if kill is not None and kill not in KILLABLE:
        raise ChaosError(f"--kill {kill}: expected one of {', '.join(KILLABLE)}")
    for step in (at, kill_worker_at, restart_temporal_at):
        if step is not None:
            parse_at(step)
    # (what, `--at`, SIGKILL?)
    pending: list[tuple[str, str, bool]] = []
    if kill is not None and at is not None:
        pending.append((kill, at, True))
    if kill_worker_at:
        pending.append(("worker", kill_worker_at, True))
    if restart_temporal_at:
        pending.append(("temporal", restart_temporal_at, False))
    has_emulator = ProcessTable(cfg.state_dir).get(CRUSOE_EMULATOR) is not None
    if any(parse_at(a)[1] for _, a, _ in pending) and not has_emulator:
        raise ChaosError("repair:before-cloud / after-cloud need the Crusoe emulator")
    try:
        chosen = fault_effects.parse_effect(effect, fault)
    except ValueError as e:
        raise ChaosError(str(e)) from None
    settings = load_file(cfg.settings_file)
    slurm = SlurmCli(cfg.slurm_conf)
    node = node or await random_job_node(slurm)
    vm = machine_names.vm_of(cfg, node)
    await asyncio.to_thread(fault_effects.apply, cfg, node, chosen)
    if broken_until is not None and vm is not None:
        Hardware(cfg.state_dir).inject(
            node, vm.vm_id, HardwareFault(fault=fault, fixed_by=broken_until)
        )
    client: Client = await temporal.connect(settings)
    if any(parse_at(a)[1] == BEFORE_CLOUD for _, a, _ in pending):
        await asyncio.to_thread(hold_first_repair_request, cfg, node)
    since = datetime.now(UTC)
    opened = await incidents.open_incident(client, settings, node, fault, opened_by="chaos")
    console.print(f"chaos: {fault} on {node}: incident {opened.incident_id}")
    handle: WorkflowHandle[NodeRemediation, IncidentState] = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    actions: list[str] = []
    strikers: list[asyncio.Task[None]] = []  # one per short step's item
    striking: list[asyncio.Task[None]] = []  # of those, the ones whose step came
    wiped: list[str] = []
    at_kill: list[str] | None = None
    moment: str | None = None
    killed_at: datetime | None = None
    deadline = time.monotonic() + timeout_s
    final: IncidentState | None = None

    async def strike(item: tuple[str, str, bool]) -> None:
        """Kill (or restart) `item`'s process now: its step is under way."""
        nonlocal moment, killed_at
        if item not in pending:  # struck already (by its watcher, or the loop)
            return
        pending.remove(item)
        what, where, sigkill = item
        step, cloud = parse_at(where)
        if cloud == AFTER_CLOUD:
            # The repair runs: crash once the emulator has recorded its operation.
            await _until_cloud_operation(cfg, node, since, deadline)
        observed: dict[str, object] = {}

        def between(what: str = what, observed: dict[str, object] = observed) -> None:
            # The old process has exited: what the cloud had seen at the crash, then
            # the worker's disk as a fresh machine would have it.
            observed["at"] = datetime.now(UTC)
            if has_emulator:
                observed["ops"] = [_op_line(o) for o in cloud_operations(cfg, node, since)]
            if what == "worker" and wipe_worker_disk_on_restart:
                observed["wiped"] = wipe_worker_disk(cfg)

        try:
            done = await asyncio.to_thread(
                restart.restart, cfg, what, kill=sigkill, between=between
            )
        except SandboxError as e:
            raise ChaosError(f"restarting {what} during {where}: {e}") from e
        if cloud == BEFORE_CLOUD:  # the held request may still be waiting: let it go
            await asyncio.to_thread(_emulator, cfg, "DELETE", "/delay")
        ops_then = observed.get("ops")
        at_kill = list(ops_then) if isinstance(ops_then, list) else None
        at_ = observed.get("at")
        killed_at = at_ if isinstance(at_, datetime) else None
        moment = step
        if step == "repair" and at_kill is not None:
            moment = f"repair:{AFTER_CLOUD if at_kill else BEFORE_CLOUD}"
            seen = ", ".join(at_kill) or "nothing"
            console.print(f"chaos: the crash landed at {moment} (the cloud had: {seen})")
        if sigkill:
            actions.append(f"killed {what} {done.old_pid} during {where}")
            console.print(f"chaos: {actions[-1]}")
            gone = observed.get("wiped")
            if isinstance(gone, list):
                wiped.extend(gone)
                actions.append("wiped the worker's disk: " + (", ".join(gone) or "nothing"))
                console.print(f"chaos: {actions[-1]}")
            actions.append(f"started {what} {done.new_pid}")
        else:
            actions.append(f"restarted Temporal during {where} (pid {done.new_pid})")
        console.print(f"chaos: {actions[-1]}")

    async def strike_when_scheduled(item: tuple[str, str, bool], activity: str) -> None:
        await ticks.scheduled(activity)
        task = asyncio.current_task()
        assert task is not None
        striking.append(task)
        await strike(item)

    async with HistoryTicks(handle) as ticks, contextlib.AsyncExitStack() as watching:
        # A short step is one activity, over in tens of ms: struck from the history's event
        # that schedules it, whatever the loop below is waiting on (a query that a loaded
        # worker answers seconds later saw the step over, and the case never struck).
        for item in list(pending):
            activity = _step_activity(item[1])
            if activity is not None:
                task = asyncio.create_task(strike_when_scheduled(item, activity))
                watching.push_async_callback(_cancelled, task)
                strikers.append(task)
        while final is None:
            for task in strikers:
                if task.done():
                    task.result()  # a strike that failed fails the case
            if time.monotonic() > deadline:
                # Stalled: cancel it, so it does not hold the node (and a repair slot) for the
                # tests that share the sandbox after this one.
                with contextlib.suppress(Exception):
                    await handle.cancel()
                raise ChaosError(
                    f"incident {opened.incident_id} still open after {timeout_s:.0f}s "
                    "(now cancelled)"
                )
            try:
                state = await handle.query(NodeRemediation.status)
            except Exception:  # the server is restarting, or no worker answers queries yet
                # A closed incident's query needs a worker to replay it; its result does not.
                if await _closed(handle):
                    with contextlib.suppress(WorkflowFailureError):
                        final = await handle.result()
                        break
                await asyncio.sleep(0.1 if pending else 0.5)
                continue
            for item in list(pending):
                if state.current_step == parse_at(item[1])[0]:
                    await strike(item)
            if state.status != "open":
                try:
                    final = await handle.result()
                except WorkflowFailureError:
                    final = await handle.query(NodeRemediation.status)
                break
            # Each change of the workflow's state is a workflow task, which ends in an event
            # of its history: a short step (over in tens of ms) is still seen.
            await ticks.wait(poll_s)
        # A watcher's strike under way ends before the report is read.
        for task in striking:
            await task
    if pending:
        missed = ", ".join(f"{what} at {step}" for what, step, _ in pending)
        console.print(f"chaos: the incident never reached the step for: {missed}")
        actions += [f"never reached {step} (no {what} restart)" for what, step, _ in pending]
    if has_emulator:
        ops = cloud_operations(cfg, node, since)
        log = [_op_line(o) for o in ops]
    else:  # no Crusoe emulator: what the sandbox's own machines recorded
        rec = machine_names.vm_of(cfg, node)
        keys = [k for k in (rec.operations if rec else {}) if k.startswith(opened.incident_id)]
        ops, log = [{"key": k} for k in keys], keys
    return ChaosReport(
        incident_id=opened.incident_id,
        node=node,
        fault=fault,
        status=final.status,
        actions=actions,
        repairs=[
            s.detail.split(":")[0] for s in final.steps if s.name == "repair" and s.outcome == "ok"
        ],
        cloud_operations=len(ops),
        cloud_operation_log=log,
        machine_operations=len(ops),
        killed_at_moment=moment,
        cloud_operations_at_kill=at_kill,
        killed_at=killed_at,
        wiped=wiped,
        opened_at=since,
        steps=final.steps,
        retried=await _retried(handle),
    )


async def _retried(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Activities that started more than once, and workflow tasks that timed out."""
    scheduled: dict[int, str] = {}
    out: list[str] = []
    timed_out = 0
    try:
        async for e in handle.fetch_history_events():
            if e.HasField("activity_task_scheduled_event_attributes"):
                scheduled[e.event_id] = (
                    e.activity_task_scheduled_event_attributes.activity_type.name
                )
            elif e.HasField("activity_task_started_event_attributes"):
                a = e.activity_task_started_event_attributes
                if a.attempt > 1:
                    out.append(f"{scheduled.get(a.scheduled_event_id, '?')} attempt {a.attempt}")
            elif e.HasField("workflow_task_timed_out_event_attributes"):
                timed_out += 1
    except Exception as e:  # the report matters more than this detail
        return [f"history unreadable: {e}"]
    return out + ([f"workflow task timed out x{timed_out}"] if timed_out else [])


# The steps that run one activity (its type), each over in tens of ms when nothing holds
# it up: struck when the history shows the activity scheduled (the health gate's agent
# half, after its activity, still goes by the query).
STEP_ACTIVITY = {
    "drain": "drain_node",
    "requeue": "requeue_jobs",
    "wait_idle": "wait_node_idle",
    "wait_registered": "wait_node_registered",
    "health_gate": "health_gate",
    "return_to_service": "return_to_service",
}


def _step_activity(where: str) -> str | None:
    """The one activity of a short step (`at`), struck when scheduled; None: struck when the
    incident's status says the step is current."""
    step, cloud = parse_at(where)
    return STEP_ACTIVITY.get(step) if cloud is None else None


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _until_cloud_operation(
    cfg: SandboxConfig, node: str, since: datetime, deadline: float
) -> None:
    """Poll the emulator's record tightly until it has an operation on the node's machine."""
    while not await asyncio.to_thread(cloud_operations, cfg, node, since):
        if time.monotonic() > deadline:
            raise ChaosError(f"the repair of {node} never reached the Crusoe emulator")
        await asyncio.sleep(0.02)


async def _closed(handle: WorkflowHandle[NodeRemediation, IncidentState]) -> bool:
    try:
        return (await handle.describe()).status != WorkflowExecutionStatus.RUNNING
    except Exception:  # the server is restarting: not known yet
        return False
