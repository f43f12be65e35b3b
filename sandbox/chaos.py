"""`autoclusters chaos`: a named fault on a node (or on a random node of a running job),
and optionally one of the sandbox's processes (worker, temporal, api, slurmctld) SIGKILLed
and started again at the moment the incident's current step becomes a given step. The
incident must still finish correctly, with no step's effect applied twice: the cloud
operations are counted from the Crusoe emulator's own record, not from our side."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime

import httpx
from pydantic import BaseModel
from rich.console import Console
from temporalio.client import Client, WorkflowFailureError

from autoclusters.clients import incidents
from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState
from autoclusters.core.policy import Rung
from autoclusters.core.settings import load_file
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import restart
from autoclusters.sandbox.cloud_api import CRUSOE_EMULATOR
from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.daemons import SandboxError
from autoclusters.sandbox.hardware import Hardware, HardwareFault
from autoclusters.sandbox.processes import ProcessTable
from autoclusters.sandbox.vms import VmRegistry
from autoclusters.workflows.remediation import NodeRemediation

# What `--kill` may crash, and the steps `--at` may name (the incident's current_step).
KILLABLE = ("worker", "temporal", "api", "slurmctld")
STEPS = (
    "drain", "requeue", "wait_idle", "repair", "wait_registered", "health_gate",
    "return_to_service",
)  # fmt: skip


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


def cloud_operations(cfg: SandboxConfig, node: str, since: datetime) -> list[dict[str, object]]:
    """The operations the Crusoe emulator performed on `node`'s machines since `since`."""
    url = f"http://127.0.0.1:{cfg.crusoe_port}/_emulator/operations"
    params = {"vm_name": node, "since": since.isoformat()}
    try:
        r = httpx.get(url, params=params, timeout=10)
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
) -> ChaosReport:
    """`kill` (one of KILLABLE) is SIGKILLed and started again when the incident's current
    step becomes `at` (one of STEPS). The older `kill_worker_at=STEP` is `kill="worker"`;
    `restart_temporal_at=STEP` stops the Temporal server gracefully (SIGTERM)."""
    console = console or Console(stderr=True)
    if (kill is None) != (at is None):
        raise ChaosError("--kill and --at go together")
    if kill is not None and kill not in KILLABLE:
        raise ChaosError(f"--kill {kill}: expected one of {', '.join(KILLABLE)}")
    for step in (at, kill_worker_at, restart_temporal_at):
        if step is not None and step not in STEPS:
            raise ChaosError(f"step {step!r}: expected one of {', '.join(STEPS)}")
    # (what, step, SIGKILL?)
    pending: list[tuple[str, str, bool]] = []
    if kill is not None and at is not None:
        pending.append((kill, at, True))
    if kill_worker_at:
        pending.append(("worker", kill_worker_at, True))
    if restart_temporal_at:
        pending.append(("temporal", restart_temporal_at, False))
    settings = load_file(cfg.settings_file)
    slurm = SlurmCli(cfg.slurm_conf)
    node = node or await random_job_node(slurm)
    vm = VmRegistry(cfg.state_dir).get(node)
    if broken_until is not None and vm is not None:
        Hardware(cfg.state_dir).inject(
            node, vm.vm_id, HardwareFault(fault=fault, fixed_by=broken_until)
        )
    client: Client = await temporal.connect(settings)
    since = datetime.now(UTC)
    opened = await incidents.open_incident(client, settings, node, fault, opened_by="chaos")
    console.print(f"chaos: {fault} on {node}: incident {opened.incident_id}")
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    actions: list[str] = []
    deadline = time.monotonic() + timeout_s
    final: IncidentState | None = None
    while final is None:
        if time.monotonic() > deadline:
            raise ChaosError(f"incident {opened.incident_id} still open after {timeout_s:.0f}s")
        try:
            state = await handle.query(NodeRemediation.status)
        except Exception:  # the server is restarting, or no worker answers queries yet
            await asyncio.sleep(0.5)
            continue
        for item in list(pending):
            what, step, sigkill = item
            if state.current_step != step:
                continue
            pending.remove(item)
            try:
                done = await asyncio.to_thread(restart.restart, cfg, what, kill=sigkill)
            except SandboxError as e:
                raise ChaosError(f"restarting {what} during {step}: {e}") from e
            if sigkill:
                actions.append(f"killed {what} {done.old_pid} during {step}")
                console.print(f"chaos: {actions[-1]}")
                actions.append(f"started {what} {done.new_pid}")
            else:
                actions.append(f"restarted Temporal during {step} (pid {done.new_pid})")
            console.print(f"chaos: {actions[-1]}")
        if state.status != "open":
            try:
                final = await handle.result()
            except WorkflowFailureError:
                final = await handle.query(NodeRemediation.status)
            break
        await asyncio.sleep(0.2)
    if pending:
        missed = ", ".join(f"{what} at {step}" for what, step, _ in pending)
        console.print(f"chaos: the incident never reached the step for: {missed}")
        actions += [f"never reached {step} (no {what} restart)" for what, step, _ in pending]
    if ProcessTable(cfg.state_dir).get(CRUSOE_EMULATOR) is not None:
        ops = cloud_operations(cfg, node, since)
        log = [f"{o['action']} {o['vm_id']} {o['state']}" for o in ops]
    else:  # no Crusoe emulator: what the sandbox's own machines recorded
        rec = VmRegistry(cfg.state_dir).get(node)
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
    )
