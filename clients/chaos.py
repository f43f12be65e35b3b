"""`autoclusters chaos`: a named fault on a node (or on a random node of a running job),
and optionally the worker killed or the Temporal server restarted in the middle of the
incident. The incident must still finish correctly, with no step's effect applied twice."""

from __future__ import annotations

import asyncio
import random
import time

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
from autoclusters.sandbox import chaos
from autoclusters.sandbox.config import SandboxConfig
from autoclusters.sandbox.hardware import Hardware, HardwareFault
from autoclusters.sandbox.vms import VmRegistry
from autoclusters.workflows.remediation import NodeRemediation


class ChaosError(RuntimeError):
    pass


class ChaosReport(BaseModel):
    incident_id: str
    node: str
    fault: str
    status: str
    actions: list[str]  # what chaos did, in order
    repairs: list[str]  # rungs the incident applied, one per repair step
    machine_operations: int  # power cycles / replacements the sandbox saw for the incident


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
) -> ChaosReport:
    console = console or Console(stderr=True)
    settings = load_file(cfg.settings_file)
    slurm = SlurmCli(cfg.slurm_conf)
    node = node or await random_job_node(slurm)
    vm = VmRegistry(cfg.state_dir).get(node)
    if broken_until is not None and vm is not None:
        Hardware(cfg.state_dir).inject(
            node, vm.vm_id, HardwareFault(fault=fault, fixed_by=broken_until)
        )
    client: Client = await temporal.connect(settings)
    opened = await incidents.open_incident(client, settings, node, fault, opened_by="chaos")
    console.print(f"chaos: {fault} on {node}: incident {opened.incident_id}")
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    actions: list[str] = []
    pending = {
        k: v
        for k, v in (("kill_worker", kill_worker_at), ("restart_temporal", restart_temporal_at))
        if v
    }
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
        for what, step in list(pending.items()):
            if state.current_step == step:
                del pending[what]
                if what == "kill_worker":
                    pid = await asyncio.to_thread(chaos.kill_worker, cfg)
                    actions.append(f"killed worker {pid} during {step}")
                    new = await asyncio.to_thread(chaos.start_worker, cfg)
                    actions.append(f"started worker {new}")
                else:
                    new = await asyncio.to_thread(chaos.restart_temporal, cfg)
                    actions.append(f"restarted Temporal during {step} (pid {new})")
                console.print(f"chaos: {actions[-1]}")
        if state.status != "open":
            try:
                final = await handle.result()
            except WorkflowFailureError:
                final = await handle.query(NodeRemediation.status)
            break
        await asyncio.sleep(0.2)
    rec = VmRegistry(cfg.state_dir).get(node)
    ops = [k for k in (rec.operations if rec else {}) if k.startswith(opened.incident_id)]
    return ChaosReport(
        incident_id=opened.incident_id,
        node=node,
        fault=fault,
        status=final.status,
        actions=actions,
        repairs=[
            s.detail.split(":")[0] for s in final.steps if s.name == "repair" and s.outcome == "ok"
        ],
        machine_operations=len(ops),
    )
