"""`demo --scenario leaf`: a bad InfiniBand leaf switch, handled as one systemic incident
(docs/systemic.md).

A sandbox of 8 nodes behind two leaves (gpu-01..04 on leaf-01, gpu-05..08 on leaf-02, as
the provider's topology discovery places them and Slurm's topology.conf says), a job on
each leaf, the provider's ticket desk, and the policy's systemic incidents on. Then
IB_LINK_DOWN on the four nodes of leaf-01 within a few seconds: their agents report it,
the fleet guard groups them into one systemic incident, whose members are drained within
the floor and parked (no reboot, no replacement), the leaf is handed to the provider once;
the demo then mends the "fabric" (the ports come back up on the machines as they are) and
answers the ticket `fixed`, as the provider would; the members are screened together and
return. The summary counts what matters: one systemic incident, its members, the machines
rebooted and replaced (0), the fewest nodes in service seen (never below the floor), the
other leaf's job untouched.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel
from rich.console import Console
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.guard import floor_of
from autoclusters.core.models import IncidentState, workflow_id
from autoclusters.core.policy import Rung, parse_policy
from autoclusters.core.settings import load_file
from autoclusters.core.systemic import SystemicState, systemic_workflow_id
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox import cluster
from autoclusters.sandbox.cluster import sandbox_policy
from autoclusters.sandbox.drivers.demo import DemoError, job_of, wait_for
from autoclusters.sandbox.drivers.ticket_cli import serve as serve_desk
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines import training_job
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation
from autoclusters.workflows.systemic_incident import SystemicIncident

NODES = 8
LEAF = "leaf-01"
MEMBERS = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
OTHER_LEAF = ["gpu-05", "gpu-06"]  # where the other leaf's job runs
FAULT = "IB_LINK_DOWN"
SPREAD_S = 2.0  # between one node's fault and the next: four within 10 s
DETECT_TIMEOUT_S = 120
END_TIMEOUT_S = 600


class MemberSummary(BaseModel):
    node: str
    incident_id: str
    status: str
    verdict: str | None
    repairs: int  # repairs of its own (0: none rebooted or replaced)
    vm_before: str | None
    vm_after: str | None
    drained_at_s: float | None  # after the first fault
    returned: bool  # back in service (Slurm) at the end


class LeafDemoSummary(BaseModel):
    scenario: str = "leaf"
    systemic_incident: str
    systemic_status: str
    level: str
    domain: str
    members: list[str]
    member_incidents: list[MemberSummary]
    faults_spread_s: float  # first fault to the last
    grouped_s: float | None  # first fault -> the systemic incident opened
    ticket: str
    handoffs: int  # tickets the desk received (1: one hand-off for the leaf)
    machines_rebooted: int
    machines_replaced: int
    floor: int
    min_in_service: int  # the fewest nodes Slurm showed in service while it ran
    screen: str  # the screen's line: together, and how
    other_leaf_job: int
    other_leaf_job_untouched: bool
    fixed_to_back_s: float | None  # the answer `fixed` -> every member back in service
    temporal_ui: str


def leaf_policy(cfg: SandboxConfig, desk_url: str) -> str:
    """The sandbox's policy with systemic incidents on, hand-offs to the desk and the
    burn-in screen (small: the path, not a fabric's figures)."""
    doc: dict[str, Any] = yaml.safe_load(sandbox_policy(cfg, burn_in=True, systemic=True))
    doc["handoff"] = {
        **doc.get("handoff", {}),
        "enabled": True,
        "url": desk_url,
        "when": ["health_gate_failed"],
        "faults": [FAULT],  # a lone link down is the provider's too: no reboot of ours
        "reminder_interval_s": 600,
    }
    text = "# `demo --scenario leaf`: systemic incidents, hand-offs to the sandbox's desk.\n"
    text += yaml.safe_dump(doc, sort_keys=False)
    parse_policy(text, str(cfg.policy_file))  # never leave the API a broken policy
    return text


async def run_leaf_demo(cfg: SandboxConfig, keep: bool, console: Console) -> LeafDemoSummary:
    cfg = cfg.model_copy(update={"nodes": max(cfg.nodes, NODES)})
    was_running = cluster.is_running(cfg) if cfg.record_file.exists() else False
    console.print(f"[bold]1. sandbox[/bold] in {cfg.state_dir} ({cfg.nodes} nodes, two leaves)")
    res = await asyncio.to_thread(cluster.up, cfg)
    console.print(
        "   already running" if res.already_running else f"   started {', '.join(res.started)}"
    )
    if res.already_running:
        cfg = SandboxConfig.load(cfg.state_dir)
        if cfg.nodes < NODES:
            raise DemoError(f"the running sandbox has {cfg.nodes} nodes; the leaf needs {NODES}")
    try:
        return await _demo(cfg, console)
    finally:
        if not keep and not was_running:
            console.print("[bold]sandbox down[/bold]")
            await asyncio.to_thread(cluster.down, cfg)


async def _demo(cfg: SandboxConfig, console: Console) -> LeafDemoSummary:
    settings = load_file(cfg.settings_file)
    slurm = SlurmCli(cfg.slurm_conf)
    topology = cfg.slurm_conf.parent / "topology.conf"
    console.print(f"   {topology}:")
    for line in topology.read_text().splitlines():
        if line.startswith("SwitchName="):
            console.print(f"     {line}")
    # The desk's own lines to stderr: with --json, stdout carries the summary alone.
    with contextlib.redirect_stdout(sys.stderr):
        await asyncio.to_thread(serve_desk, cfg.state_dir, False, 600, None)
    cfg.policy_file.write_text(leaf_policy(cfg, f"{cfg.ticket_desk_url}/tickets"))

    other, _log, _kind = await training_job.submit(
        slurm,
        cfg,
        "other-leaf",
        (f"--nodelist={','.join(OTHER_LEAF)}", f"--nodes={len(OTHER_LEAF)}"),
        stand_in=True,
    )
    job = await wait_for("the other leaf's job to run", lambda: _running(slurm, other), 120)
    console.print(f"[bold]2. jobs[/bold] job {other} on {job.nodes} (leaf-02)")

    vms = {n: _vm(cfg, n) for n in MEMBERS}
    client = await temporal.connect(settings)
    console.print(
        f"[bold]3. fault[/bold] {FAULT} on {', '.join(MEMBERS)} ({LEAF}), {SPREAD_S:g}s apart"
    )
    hardware = Hardware(cfg.state_dir)
    first_at = time.time()
    for i, node in enumerate(MEMBERS):
        if i:
            await asyncio.sleep(SPREAD_S)
        vm = vms[node]
        if vm is None:
            raise DemoError(f"{node} has no machine in the sandbox")
        # The switch's fault, seen on the machine: its port goes down; only a fix of the
        # fabric (not a reboot of ours) clears it: `fixed_by` is never reached by a reset.
        hardware.inject(node, vm, HardwareFault(fault=FAULT, fixed_by=Rung.RESET_GPU))
    spread = time.time() - first_at

    sys_id = systemic_workflow_id(settings.cluster, "leaf", LEAF)
    handle = client.get_workflow_handle_for(SystemicIncident.run, sys_id)
    watch = _InService(slurm, cfg.nodes)
    watcher = asyncio.create_task(watch.run())
    try:
        opened = await wait_for(
            "the systemic incident", lambda: _systemic(handle, first_at), DETECT_TIMEOUT_S, 0.2
        )
        grouped_s = opened.request.opened_at.timestamp() - first_at
        console.print(
            f"   one systemic incident {opened.request.incident_id} ({opened.request.level} "
            f"{opened.request.domain}) {grouped_s:.1f}s after the first fault"
        )
        await wait_for(
            "the hand-off to the provider", lambda: _handed_off(handle), END_TIMEOUT_S, 0.5
        )
        # The provider mends the leaf once all four have been seen: a member whose agent is
        # slow to report (its port's two readings) would otherwise find its port up again
        # before it ever opened an incident.
        waiting = await wait_for(
            "every member in the systemic incident", lambda: _joined(handle), END_TIMEOUT_S, 0.5
        )
        assert waiting.handoff is not None
        drained = [m.node for m in waiting.members if m.drained]
        console.print(
            f"   members {', '.join(m.node for m in waiting.members)}; drained "
            f"{', '.join(drained)}; handed off to the provider (ticket {waiting.handoff.ticket})"
        )
        console.print(
            "[bold]4. the provider[/bold] mends the leaf (the ports come up on the machines "
            "as they are) and answers the ticket fixed"
        )
        for node in MEMBERS:
            vm = vms[node]
            assert vm is not None
            hardware.repaired(node, vm, Rung.RESET_GPU)
        await asyncio.sleep(3)  # the agents' next reading shows the ports up
        fixed_at = time.time()
        await _answer(cfg, opened.request.incident_id)
        final = await wait_for("the systemic incident to end", lambda: _ended(handle), 600, 1.0)
        members = [await _member(client, settings.cluster, n, first_at) for n in MEMBERS]
        back_at = await wait_for(
            "every member back in service",
            lambda: _all_back(slurm, members),
            END_TIMEOUT_S,
            1.0,
        )
    finally:
        watch.stop = True
        await watcher
    tickets = _tickets(cfg, first_at)
    job_after = await job_of(slurm, other)
    summaries = [
        MemberSummary(
            node=m.request.node,
            incident_id=m.request.incident_id,
            status=m.status,
            verdict=m.systemic_verdict.verdict if m.systemic_verdict else None,
            repairs=m.repair_attempts,
            vm_before=vms[m.request.node],
            vm_after=_vm(cfg, m.request.node),
            drained_at_s=_drained_at(m, first_at),
            returned=not (await _node(slurm, m.request.node)).get("drained", True),
        )
        for m in members
    ]
    screen = _screen_line(final)
    return LeafDemoSummary(
        systemic_incident=final.request.incident_id,
        systemic_status=final.status,
        level=final.request.level,
        domain=final.request.domain,
        members=[m.node for m in final.members],
        member_incidents=summaries,
        faults_spread_s=round(spread, 3),
        grouped_s=round(grouped_s, 3),
        ticket=final.handoff.ticket if final.handoff else "",
        handoffs=len(tickets),
        machines_rebooted=sum(1 for m in members if m.step("repair")),
        machines_replaced=sum(1 for s in summaries if s.vm_after != s.vm_before),
        floor=floor_of(final.request.policy.guard, cfg.nodes),
        min_in_service=watch.least,
        screen=screen,
        other_leaf_job=other,
        other_leaf_job_untouched=job_after is not None
        and job_after.job_state == "RUNNING"
        and job_after.restart_cnt == 0
        and job_after.nodes == job.nodes,
        fixed_to_back_s=round(back_at - fixed_at, 3),
        temporal_ui=f"{cfg.temporal_ui_url}/namespaces/default/workflows/{sys_id}",
    )


class _InService:
    """The fewest nodes Slurm shows in service (not drained, not down), read every second."""

    def __init__(self, slurm: SlurmCli, nodes: int) -> None:
        self._slurm = slurm
        self.least = nodes
        self.stop = False

    async def run(self) -> None:
        while not self.stop:
            try:
                nodes = await self._slurm.nodes()
                if nodes:
                    up = sum(1 for n in nodes if not n.drained and "down" not in n.state)
                    self.least = min(self.least, up)
            except Exception:  # noqa: BLE001 - a read that failed says nothing
                pass
            await asyncio.sleep(1)


async def _running(slurm: SlurmCli, job_id: int) -> Any:
    job = await job_of(slurm, job_id)
    return job if job is not None and job.job_state == "RUNNING" else None


def _vm(cfg: SandboxConfig, node: str) -> str | None:
    vm = machine_names.vm_of(cfg, node)
    return vm.vm_id if vm is not None else None


async def _systemic(handle: Any, since: float) -> SystemicState | None:
    try:
        state: SystemicState = await handle.query(SystemicIncident.status)
    except RPCError:
        return None
    return state if state.request.opened_at.timestamp() >= since - 1 else None


async def _handed_off(handle: Any) -> SystemicState | None:
    state: SystemicState = await handle.query(SystemicIncident.status)
    if state.status != "open":
        raise DemoError(f"the systemic incident ended {state.status} before its hand-off")
    h = state.handoff
    return state if h is not None and h.sent_at is not None else None


async def _joined(handle: Any) -> SystemicState | None:
    state: SystemicState = await handle.query(SystemicIncident.status)
    if state.status != "open":
        raise DemoError(f"the systemic incident ended {state.status} before all joined")
    return state if {m.node for m in state.members} >= set(MEMBERS) else None


async def _ended(handle: Any) -> SystemicState | None:
    state: SystemicState = await handle.query(SystemicIncident.status)
    return state if state.status != "open" else None


async def _answer(cfg: SandboxConfig, incident_id: str) -> None:
    """As `autoclusters sandbox ticket answer INCIDENT --fixed`: the desk signs the answer
    and POSTs it to the API, which takes it to the systemic incident."""
    url = f"{cfg.ticket_desk_url}/_desk/tickets/{incident_id}/answer"
    body = {"answer": "fixed", "note": "replaced the leaf switch's failed line card"}
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        r = await http.post(url, json=body)
    said = r.json()
    if r.status_code != 200 or said.get("status") != 200:
        raise DemoError(f"the answer was not taken: {said}")


def _tickets(cfg: SandboxConfig, since: float) -> list[dict[str, Any]]:
    """The desk's tickets opened since `since` (a kept sandbox's desk keeps older ones)."""
    r = httpx.get(
        f"{cfg.ticket_desk_url}/_desk/tickets",
        timeout=30,
        trust_env=False,
        verify=default_verify(False),
    )
    tickets: list[dict[str, Any]] = r.json()
    return [t for t in tickets if float(t.get("received_at", 0)) >= since - 1]


async def _member(client: Client, cluster_name: str, node: str, since: float) -> IncidentState:
    handle = client.get_workflow_handle_for(NodeRemediation.run, workflow_id(cluster_name, node))

    async def ended() -> IncidentState | None:
        try:
            state = await handle.query(NodeRemediation.status)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return None  # its fault not reported yet (a busy agent): wait for it
            raise
        if state.request.opened_at.timestamp() < since - 1:
            raise DemoError(f"no incident opened on {node} after the fault")
        return state if state.status != "open" else None

    return await wait_for(f"{node}'s incident to end", ended, END_TIMEOUT_S, 1.0)


async def _node(slurm: SlurmCli, name: str) -> dict[str, Any]:
    node = next((n for n in await slurm.nodes() if n.name == name), None)
    return {"drained": node.drained or "down" in node.state} if node is not None else {}


async def _all_back(slurm: SlurmCli, members: list[IncidentState]) -> float | None:
    for m in members:
        if (await _node(slurm, m.request.node)).get("drained", True):
            return None
    return time.time()


def _drained_at(m: IncidentState, since: float) -> float | None:
    d = m.step("drain")
    return round(d.finished_at.timestamp() - since, 3) if d and d.finished_at else None


def _screen_line(s: SystemicState) -> str:
    screens = [st for st in s.steps if st.name == "burn_in_screen"]
    return "; ".join(st.detail for st in screens) or "not screened"


def print_leaf_summary(s: LeafDemoSummary, out: Console) -> None:
    ok = "[green]ok[/green]" if s.machines_replaced == 0 and s.machines_rebooted == 0 else "[red]!"
    out.print()
    out.print(
        f"[bold]systemic incident[/bold]  {s.systemic_incident} ({s.systemic_status}; "
        f"{s.level} {s.domain}, grouped {s.grouped_s:.1f}s after the first fault)"
    )
    out.print(f"members            {', '.join(s.members)} (faults within {s.faults_spread_s:.1f}s)")
    for m in s.member_incidents:
        out.print(
            f"  {m.node}           {m.incident_id}: {m.status}, verdict {m.verdict}, "
            f"repairs {m.repairs}, {'back in service' if m.returned else 'DRAINED'}"
        )
    out.print(
        f"machines           rebooted {s.machines_rebooted}, replaced {s.machines_replaced} {ok}"
    )
    out.print(f"floor              {s.min_in_service} in service at the least (floor {s.floor})")
    out.print(f"hand-off           {s.handoffs} ticket(s): {s.ticket}")
    out.print(f"screen             {s.screen}")
    out.print(
        f"other leaf         job {s.other_leaf_job} "
        f"{'untouched' if s.other_leaf_job_untouched else '[red]DISTURBED[/red]'}"
    )
    fixed = f"{s.fixed_to_back_s:.1f} s" if s.fixed_to_back_s is not None else "n/a"
    out.print(f"fixed → back       {fixed}")
    out.print(f"Temporal UI        {s.temporal_ui}")


def leaf_demo_ok(s: LeafDemoSummary) -> bool:
    return (
        s.systemic_status == "resolved"
        and s.machines_replaced == 0
        and s.machines_rebooted == 0
        and s.handoffs == 1
        and s.min_in_service >= s.floor
        and s.other_leaf_job_untouched
        and all(m.returned for m in s.member_incidents)
    )


__all__ = ["LeafDemoSummary", "leaf_demo_ok", "print_leaf_summary", "run_leaf_demo"]


def main(
    as_json: bool, keep: bool, state_dir: Path, port_base: int, boot_delay: float, k8s: bool
) -> int:
    """`autoclusters demo --scenario leaf`: the summary, and one JSON line with --json;
    exit 1 unless it resolved as the target says (leaf_demo_ok)."""
    err = Console(stderr=True)
    cfg = SandboxConfig(
        state_dir=state_dir.absolute(),
        port_base=port_base,
        boot_delay_s=boot_delay,
        k8s=k8s,
        nodes=NODES,
    )
    out = err if as_json else Console()
    try:
        summary = asyncio.run(run_leaf_demo(cfg, keep=keep, console=out))
    except DemoError as e:
        err.print(f"[red]demo failed:[/red] {e}")
        return 1
    print_leaf_summary(summary, out)
    if as_json:
        print(summary.model_dump_json())
    return 0 if leaf_demo_ok(summary) else 1
