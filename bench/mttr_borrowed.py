"""bench/mttr.py's borrowed path: the job goes on, on a node borrowed from inference, while
its failed node is repaired.

The borrow demo's set-up (sandbox/drivers/sharing_borrow_demo.py `set_up_borrow`: the
sharing workflow with `borrow_from_inference`, two nodes serving inference, a 2-node job at
its width on the other two, the incident policy's requeue path), inference serving a steady load
throughout, then K faults one after the other on the same job. Each fault's GPU stays
broken until a replacement (the reboot fails its gate), a repair that outlasts the borrow:
the incident requeues the job, which cannot start on one node; the sharing workflow lends it an
inference node and it starts there at full width from its checkpoint; the repaired node
returns, the sharing workflow gives the borrowed node back (the job checkpoints and requeues onto
the repaired node) and the next fault comes once the job steps there.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import yaml
from rich.console import Console

from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState
from autoclusters.sandbox.drivers.demo import DemoError, incident_since, wait_for
from autoclusters.sandbox.drivers.load import Load
from autoclusters.sandbox.drivers.sharing_borrow_demo import (
    FAULT,
    FIXED_BY,
    LENT,
    WIDTH,
    BorrowRig,
    _borrow_in,
    _explained,
    _on,
    set_up_borrow,
)
from autoclusters.sandbox.drivers.sharing_demo import CALM_RPS, _width
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.machines.joblog import (
    first_progress_after_restart,
    progress_lines,
    went_on_from,
)
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation

# A borrow's whole cycle (lent, the job on it, the repair of a replacement, the give-back,
# the job back on the repaired node) takes about 90 s on this machine with 30 s boots.
CYCLE_TIMEOUT_S = 300


@dataclass
class BorrowedFault:
    """One fault on the borrowed path, in seconds from the fault unless said."""

    node: str
    fault_at: float
    state: IncidentState
    borrowed_node: str
    lent: float | None  # the borrowed node in Slurm for the job
    job_again: float  # the job's first step at full width on the borrowed node
    redone: int | None  # steps done again after the fault (its last step - its checkpoint)
    back_in_service: float | None  # the repaired node returned by the incident
    given_back: float | None  # the borrowed node serving inference again
    off_borrowed: float  # the job's first step on the repaired node, after the give-back
    redone_at_give_back: int | None
    steps_on_borrowed: int
    requests: int  # inference requests sent over the fault's cycle, and those that failed
    requests_failed: int


def fresh_fault_policy(cfg: SandboxConfig) -> None:
    """The set-up's policy (the requeue path), with each fault a fresh one: no recurrence
    escalation between bench faults on a node the bench faulted before."""
    doc = yaml.safe_load(cfg.policy_file.read_text())
    doc["recurrence_window_s"] = 0.001
    cfg.policy_file.write_text(yaml.safe_dump(doc, sort_keys=False))


async def borrowed_faults(
    cfg: SandboxConfig, incidents: int, gap_s: float, console: Console
) -> tuple[BorrowRig, list[BorrowedFault]]:
    rig = await set_up_borrow(cfg, console)
    fresh_fault_policy(cfg)
    load = Load(cfg.inference_gateway_url, rps=CALM_RPS)
    await load.start()
    faults: list[BorrowedFault] = []
    try:
        for k in range(incidents):
            f = await _one_fault(cfg, rig, load, gap_s)
            faults.append(f)
            console.print(
                f"incident {k + 1}/{incidents}: {f.state.request.incident_id} {f.state.status} "
                f"on {f.node}, {f.borrowed_node} lent +{f.lent or float('nan'):.1f}s, "
                f"job again +{f.job_again:.1f}s, node back "
                f"+{f.back_in_service or float('nan'):.1f}s, given back "
                f"+{f.given_back or float('nan'):.1f}s, {f.requests_failed}/{f.requests} "
                "requests failed"
            )
    finally:
        await load.stop(drain=True)
    await rig.slurm.cancel(rig.job_id)
    return rig, faults


async def _one_fault(cfg: SandboxConfig, rig: BorrowRig, load: Load, gap_s: float) -> BorrowedFault:
    slurm, job_id, log = rig.slurm, rig.job_id, rig.log
    job = await wait_for(
        "the job at its width", lambda: _width(slurm, job_id, WIDTH), CYCLE_TIMEOUT_S
    )
    await wait_for(
        "the job to step",
        lambda: _first_step(rig, job.restart_cnt),
        CYCLE_TIMEOUT_S,
        0.2,
    )
    await asyncio.sleep(gap_s)  # let it train (and checkpoint) between faults
    node = hostlist.expand(job.nodes)[-1]
    vm = machine_names.vm_of(cfg, node)
    if vm is None:
        raise DemoError(f"no machine for {node}")
    sent, failed = load.stats.sent, load.stats.errors
    fault_at = time.time()
    Hardware(cfg.state_dir).inject(node, vm.vm_id, HardwareFault(fault=FAULT, fixed_by=FIXED_BY))
    opened = await wait_for(
        "the fault to open an incident",
        lambda: incident_since(rig.tc, rig.name, node, fault_at),
        60,
    )
    mine = opened.incident_id
    lent = await _explained(
        rig.tc, rig.name, "an inference node lent", _borrow_in(rig.tc, rig.name, LENT, mine), 240
    )
    during = await wait_for(
        "the job at full width on the borrowed node",
        lambda: _on(slurm, job_id, lent.node, True),
        CYCLE_TIMEOUT_S,
    )
    job_again = await wait_for(
        "the job to step on the borrowed node",
        lambda: _first_step(rig, during.restart_cnt),
        CYCLE_TIMEOUT_S,
        0.2,
    )
    handle = rig.tc.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    state = await handle.result()
    gone = await _explained(
        rig.tc,
        rig.name,
        "the borrowed node back in inference",
        _borrow_in(rig.tc, rig.name, {"returned"}, mine),
        240,
    )
    after = await wait_for(
        "the job at full width off the borrowed node",
        lambda: _on(slurm, job_id, lent.node, False),
        CYCLE_TIMEOUT_S,
    )
    off_borrowed = await wait_for(
        "the job to step off the borrowed node",
        lambda: _first_step(rig, after.restart_cnt),
        CYCLE_TIMEOUT_S,
        0.2,
    )
    lines = progress_lines(log)
    before = [p.step for p in lines if job.restart_cnt <= p.restart < during.restart_cnt]
    resumed = went_on_from(log, during.restart_cnt)
    on_borrowed = [p.step for p in lines if during.restart_cnt <= p.restart < after.restart_cnt]
    back_from = went_on_from(log, after.restart_cnt)
    back = state.step("return_to_service")

    def since(t: float | None) -> float | None:
        return t - fault_at if t is not None else None

    return BorrowedFault(
        node=node,
        fault_at=fault_at,
        state=state,
        borrowed_node=gone.node,
        lent=since(gone.lent_at),
        job_again=job_again - fault_at,
        redone=max(before) - resumed if before and resumed is not None else None,
        back_in_service=since(back.finished_at.timestamp() if back and back.finished_at else None),
        given_back=since(gone.returned_at),
        off_borrowed=off_borrowed - fault_at,
        redone_at_give_back=(
            max(on_borrowed) - back_from if on_borrowed and back_from is not None else None
        ),
        steps_on_borrowed=len(set(on_borrowed)),
        requests=load.stats.sent - sent,
        requests_failed=load.stats.errors - failed,
    )


async def _first_step(rig: BorrowRig, restart: int) -> float | None:
    return first_progress_after_restart(rig.log, restart)
