"""The demo: a whole local cluster, a job, a fault on one of its nodes, the remediation.

It measures the two clocks separately: job recovery (fault → the job steps again, read
from the job's own log) and capacity recovery (fault → the node back in service). And which
path detected the fault: the node agent's direct report, or its metrics through Prometheus
and Alertmanager to the API's webhook (sandbox/monitoring.py), with each path's time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel
from rich.console import Console
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from autoclusters.clients import incidents
from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState, SlurmJob, workflow_id
from autoclusters.core.policy import Rung
from autoclusters.core.settings import load_file, policy_for
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.integrations.tls import default_verify
from autoclusters.sandbox import cluster, provision
from autoclusters.sandbox.cluster import sandbox_policy
from autoclusters.sandbox.machines import fault_effects, training_job
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines.hardware import HardwareFault
from autoclusters.sandbox.machines.joblog import (
    ProgressLine,
    first_progress_after_reforming,
    first_progress_after_restart,
    progress_lines,
    training_nodes,
    went_on_from,
)
from autoclusters.sandbox.runtime import api_tokens
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation

T = TypeVar("T")


class DemoError(RuntimeError):
    pass


class StepSummary(BaseModel):
    name: str
    started_at: datetime
    finished_at: datetime | None
    duration_s: float | None
    outcome: str


class ScreenSummary(BaseModel):
    """The burn-in screen before return (the incident's last one; policy burn_in)."""

    passed: bool
    seconds: float  # the whole screen: reservation, job, clean-up
    neighbour: str | None  # None: no healthy idle node, screened alone
    backend: str | None  # gloo in the sandbox, nccl on GPUs
    allreduce_s: float | None  # one all-reduce round, the mean of the timed ones
    algbw_gbps: float | None
    busbw_gbps: float | None
    diag: dict[str, str]  # node -> "pass" or what the active diagnostic found
    screens: int  # how many the incident ran (a failed one climbs the ladder)


class DemoSummary(BaseModel):
    incident_id: str
    node: str
    fault: str
    # What the fault did to the job on the node (sandbox/machines/fault_effects.py): crash, hang,
    # lost, slow or none (the node's agent sees it, the job does not).
    fault_effect: str = "none"
    mode: str
    status: str
    rung: str | None
    job_id: int
    detect_s: float  # fault on the GPU -> incident opened (by whichever path came first)
    # The source that opened the incident: agent (its direct report) or alertmanager
    # (the agent's /metrics -> Prometheus -> Alertmanager -> the API's webhook).
    detected_by: str
    # Fault -> the alert path's report on the incident (seen by polling it every 0.5 s; the
    # incident keeps no receive time per report); None: it had not come before the summary.
    alert_path_detect_s: float | None
    job_recovery_s: float | None
    capacity_recovery_s: float | None
    job_restarts: int
    # How the job got going again: requeue, or in-job (a hot spare in its own allocation);
    # None: the incident did not reach the requeue step (observe mode, for one).
    recovery_path: str | None = None
    # examples/training as a torchrun job (requeue path) or in its in-job mode (a standby in
    # its allocation), or the stand-in when torch is not installed (or asked for: --job stand-in).
    job: str  # torchrun | in-job | stand-in
    resumed_from_step: int | None  # the step the recovered job went on from
    # Steps done before the fault that the job did again after it (the last step logged
    # before it recovered minus the step it went on from); 0: no work lost.
    steps_recomputed: int | None = None
    last_step: int | None  # the job's last step logged before the summary
    job_nodes_before: list[str]
    job_nodes_after: list[str]
    node_state_before: str
    node_state_after: str
    kubernetes: bool
    platform: str = "managed-slurm"  # managed-slurm | cmk (sandbox up --platform)
    old_vm_id: str | None
    new_vm_id: str | None
    health_gates: list[bool]
    spare_node: str | None
    # The Alertmanager silence the incident held on the node's other alerts (docs/runbook.md).
    silence_id: str | None = None
    # The burn-in screen in a breakfix reservation before the node returned (docs/runbook.md).
    screen: ScreenSummary | None = None
    planned_steps: list[str]
    boot_delay_s: float
    provision_s: float | None  # cluster spec -> cluster ready (ClusterProvisioning)
    temporal_ui: str
    steps: list[StepSummary]


async def wait_for(
    what: str, check: Callable[[], Awaitable[T | None]], timeout_s: float, interval_s: float = 0.5
) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await check()
        if value:
            return value
        await asyncio.sleep(interval_s)
    raise DemoError(f"timed out after {timeout_s:.0f}s waiting for {what}")


async def job_of(slurm: SlurmCli, job_id: int) -> SlurmJob | None:
    return next((j for j in await slurm.jobs() if j.job_id == job_id), None)


# The demo's fault effect when none is asked for: "default" is the fault's realistic one
# (XID_79: hang), "none" only what the node's agent reads.
DEMO_FAULT_EFFECT = "default"


async def run_demo(
    cfg: SandboxConfig,
    fault: str,
    keep: bool,
    console: Console,
    mode: str = "auto",
    broken_until: str = "reboot",
    job_recovery: str = "in-job",
    stand_in: bool = False,
    fault_effect: str | None = None,
) -> DemoSummary:
    """`fault_effect`: crash, hang, lost, slow, none, or default (the fault's realistic
    effect); None: DEMO_FAULT_EFFECT."""
    effect = fault_effects.parse_effect(fault_effect or DEMO_FAULT_EFFECT, fault)
    was_running = cluster.is_running(cfg) if cfg.record_file.exists() else False
    console.print(f"[bold]1. sandbox[/bold] in {cfg.state_dir} ({cfg.nodes} nodes)")
    res = await asyncio.to_thread(cluster.up, cfg)
    console.print(
        "   already running" if res.already_running else f"   started {', '.join(res.started)}"
    )
    if res.provision_s is not None:
        console.print(
            f"   cluster {cfg.cluster} provisioned by ClusterProvisioning in {res.provision_s:.1f}s"
        )
    if res.already_running:
        cfg = SandboxConfig.load(cfg.state_dir)
    try:
        return await _demo(
            cfg, fault, mode, Rung(broken_until), job_recovery, stand_in, console, effect
        )
    finally:
        if not keep and not was_running:
            console.print("[bold]sandbox down[/bold]")
            await asyncio.to_thread(cluster.down, cfg)
        elif cfg.k8s:
            console.print(f"sandbox kept: KUBECONFIG={cfg.kubeconfig} kubectl get nodes")


async def _demo(
    cfg: SandboxConfig,
    fault: str,
    mode: str,
    broken_until: Rung,
    job_recovery: str,
    stand_in: bool,
    console: Console,
    effect: fault_effects.Effect = "none",
) -> DemoSummary:
    settings = load_file(cfg.settings_file)
    policy = policy_for(settings).model_copy(update={"mode": mode})
    slurm = SlurmCli(cfg.slurm_conf)
    in_job = job_recovery == "in-job"
    job_id, log, kind = await training_job.submit(
        slurm, cfg, "train", in_job=in_job, stand_in=stand_in
    )
    console.print(
        "[bold]2. job[/bold] a 2-node training job with a standby node in its allocation "
        "(in-job recovery), --requeue as its fallback"
        if kind == "in-job"
        else f"[bold]2. job[/bold] a 2-node batch job with --requeue ({kind})"
    )

    async def running_with_progress() -> SlurmJob | None:
        job = await job_of(slurm, job_id)
        if not (job and job.job_state == "RUNNING" and first_progress_after_restart(log, 0)):
            return None
        # In-job mode: both training nodes a few steps in (the standby logs nothing until
        # it is needed). A requeued job: past its first checkpoint, which the fault (a rank
        # that hangs stops the job at once) leaves it to resume from.
        if kind == "in-job":
            return job if len(training_nodes(log, from_step=3)) >= 2 else None
        newest = max((p.step for p in progress_lines(log)), default=0)
        checkpointed = newest > training_job.CKPT_EVERY
        return job if kind == "stand-in" or checkpointed else None

    # torchrun on two nodes: its first step comes after torch loads on four processes and
    # they meet; on a busy 2-core machine (the test suite beside it) that took over 60 s.
    job = await wait_for("the job to run", running_with_progress, 180)
    before = hostlist.expand(job.nodes)
    console.print(f"   job {job_id} running on {', '.join(before)}; log {log}")

    # A node the job trains on (in-job: not the standby; its last, never the batch host
    # that holds the job's store: the allocation's first node).
    node = max(training_nodes(log)) if kind == "in-job" else before[-1]
    node_before = await slurm.node(node)
    vm = machine_names.vm_of(cfg, node)  # on CMK the VM is not named as the node
    # The cluster's mode lives in its policy file, which every new incident reads; the
    # demo's repaired node passes a burn-in screen before it returns.
    cfg.policy_file.write_text(sandbox_policy(cfg, mode=mode, burn_in=True))
    client = await temporal.connect(settings)
    console.print(
        f"[bold]3. fault[/bold] {fault} on {node}'s GPU 0 "
        f"(mode {mode}; effect on the job: {effect})"
    )
    fault_at = time.time()
    if vm is not None:
        # The fault is real on the machine: the job's rank there crashes, hangs, vanishes
        # with the node or slows down (`effect`), the node's agent sees it (NVML, as it would
        # on a GPU node) and reports it; the health gate fails until `broken_until`.
        await asyncio.to_thread(
            fault_effects.inject,
            cfg, node, vm.vm_id, HardwareFault(fault=fault, fixed_by=broken_until), effect,
            job_id=job_id,
        )  # fmt: skip
    opened = await wait_for(
        "the fault to open an incident",
        lambda: incident_since(client, settings.cluster, node, fault_at),
        60,
        0.1,
    )
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    first = await handle.query(NodeRemediation.status)
    console.print(
        f"   detected by {path_name(first.request.opened_by)}: incident {opened.incident_id}; "
        f"follow it in {cfg.temporal_ui_url} or the console {cfg.api_url}/ui/"
    )
    alert_seen: float | None = None
    result_task = asyncio.create_task(handle.result())
    shown: set[str] = set()
    asked: set[tuple[str | None, datetime]] = set()  # approvals already asked for
    approver = policy.approvers[0] if policy.approvers else "USER"
    while not result_task.done():
        state = await handle.query(NodeRemediation.status)
        print_new_steps(console, state, shown)
        if alert_seen is None and alert_path_reported(state):
            alert_seen = time.time() - fault_at
            console.print(f"   the alert path reported it too: {alert_seen:.1f}s after the fault")
        waiting = state.waiting_for
        if waiting and waiting.kind == "approval" and (waiting.step, waiting.since) not in asked:
            asked.add((waiting.step, waiting.since))
            console.print(
                f"   [yellow]waiting for approval of {waiting.step}[/yellow]: click Approve in "
                "Slack, in another terminal:\n"
                f"     AUTOCLUSTERS_CONFIG={cfg.settings_file} autoclusters sandbox slack click "
                f"--incident {opened.incident_id} --action approve --as U_{approver.upper()}\n"
                f"   or, as {approver} with their own operator token: "
                f"AUTOCLUSTERS_CONFIG={cfg.settings_file} AUTOCLUSTERS_API_TOKEN=$(cat "
                f"{api_tokens.operator_file(cfg, approver)}) "
                f"autoclusters approve {opened.incident_id} [--reject]",
                soft_wrap=True,  # whole command lines, to copy and paste
            )
        await asyncio.wait({result_task}, timeout=0.5)
    try:
        final: IncidentState = result_task.result()
        status = final.status
    except WorkflowFailureError as e:
        console.print(f"[red]   incident failed: {e.cause}[/red]")
        final = await handle.query(NodeRemediation.status)
        status = "failed"
    print_new_steps(console, final, shown)
    detect_s = round(final.request.opened_at.timestamp() - fault_at, 3)
    if final.request.opened_by == ALERT_SOURCE:
        alert_seen = detect_s
    elif alert_seen is None and alert_path_reported(final):
        alert_seen = time.time() - fault_at
    if mode == "approve":
        console.print("[bold]4. the incident's Slack thread[/bold]")
        console.print(await asyncio.to_thread(_slack_channel, cfg))

    path = final.recovery_path.get(job_id)
    resumed_from: int | None = None
    recomputed: int | None = None
    if path == "in-job":

        async def reformed() -> ProgressLine | None:
            return first_progress_after_reforming(log, fault_at)

        line = await wait_for("the job to step again", reformed, 60)
        job_after = await job_of(slurm, job_id) or job
        recovery_s: float | None = round(line.ts - fault_at, 3)
        resumed_from = line.resumed_from
        before_fault = [p.step for p in progress_lines(log) if p.elastic < line.elastic]
    elif final.requeued_jobs:
        job_after, resumed_ts = await wait_for(
            "the job to step again", lambda: restarted_job(slurm, job_id, log), 60
        )
        recovery_s = round(resumed_ts - fault_at, 3)
        resumed_from = went_on_from(log, job_after.restart_cnt)
        before_fault = [p.step for p in progress_lines(log) if p.restart < job_after.restart_cnt]
    else:  # observe or monitor: nothing was requeued
        job_after, recovery_s, before_fault = await job_of(slurm, job_id) or job, None, []
    if before_fault and resumed_from is not None:
        recomputed = max(before_fault) - resumed_from
    node_after = await slurm.node(node)
    # Capacity is back when the node returns, or at once when a hot spare took its place.
    back = final.step("take_spare") if final.spare_node else final.step("return_to_service")
    capacity = (
        back.finished_at.timestamp() - fault_at
        if back and back.finished_at and status == "resolved"
        else None
    )
    return DemoSummary(
        incident_id=opened.incident_id,
        node=node,
        fault=fault,
        fault_effect=effect,
        mode=mode,
        status=status,
        rung=final.rung,
        job_id=job_id,
        detect_s=detect_s,
        detected_by=final.request.opened_by,
        alert_path_detect_s=round(alert_seen, 3) if alert_seen is not None else None,
        job_recovery_s=recovery_s,
        capacity_recovery_s=round(capacity, 3) if capacity is not None else None,
        job_restarts=job_after.restart_cnt,
        recovery_path=path,
        job=kind,
        resumed_from_step=resumed_from,
        steps_recomputed=recomputed,
        last_step=max((p.step for p in progress_lines(log)), default=None),
        job_nodes_before=before,
        job_nodes_after=hostlist.expand(job_after.nodes),
        node_state_before=node_before.display_state if node_before else "UNKNOWN",
        node_state_after=node_after.display_state if node_after else "UNKNOWN",
        kubernetes=cfg.k8s,
        platform=cfg.platform,
        old_vm_id=final.old_vm_id or (vm.vm_id if vm else None),
        new_vm_id=final.new_vm_id or (vm.vm_id if vm else None),
        health_gates=[h.passed for h in final.health],
        spare_node=final.spare_node,
        silence_id=final.silence_id,
        screen=screen_summary(final),
        planned_steps=final.planned_steps,
        boot_delay_s=cfg.boot_delay_s,
        provision_s=await provision.provision_seconds(client, cfg.cluster),
        temporal_ui=f"{cfg.temporal_ui_url}/namespaces/default/workflows/{opened.workflow_id}",
        steps=[
            StepSummary(
                name=s.name,
                started_at=s.started_at,
                finished_at=s.finished_at,
                duration_s=(s.finished_at - s.started_at).total_seconds()
                if s.finished_at
                else None,
                outcome=s.outcome,
            )
            for s in final.steps
        ],
    )


def screen_summary(final: IncidentState) -> ScreenSummary | None:
    if not final.screens:
        return None
    last = final.screens[-1]
    return ScreenSummary(
        passed=last.passed,
        seconds=last.seconds,
        neighbour=last.neighbour,
        backend=last.backend,
        allreduce_s=last.allreduce_s,
        algbw_gbps=last.algbw_gbps,
        busbw_gbps=last.busbw_gbps,
        diag=last.diag,
        screens=len(final.screens),
    )


ALERT_SOURCE = "alertmanager"  # the API's source name for its Alertmanager webhook


def path_name(source: str) -> str:
    """The detection path a source stands for, in an operator's words."""
    if source == ALERT_SOURCE:
        return "Prometheus → Alertmanager (the agent's /metrics, the shipped alert rules)"
    if source == "agent":
        return "the node agent (its direct report)"
    return source


def alert_path_reported(state: IncidentState) -> bool:
    """Whether the incident holds a report that came through Alertmanager."""
    return any(e.source == ALERT_SOURCE for f in state.faults for e in f.evidence)


def _slack_channel(cfg: SandboxConfig) -> str:
    import httpx

    from autoclusters.sandbox.slack.cli import render_channel

    try:
        view = httpx.get(
            f"http://127.0.0.1:{cfg.slack_port}/_emulator/channels/incidents",
            verify=default_verify(),
        ).json()
    except httpx.HTTPError as e:
        return f"(the sandbox's Slack did not answer: {e})"
    return render_channel(view)


async def incident_since(
    client: Client, cluster: str, node: str, since: float
) -> incidents.OpenedIncident | None:
    """The node's incident, if one opened after `since`."""
    try:
        desc = await client.get_workflow_handle(workflow_id(cluster, node)).describe()
    except RPCError:
        return None
    if desc.start_time is None or desc.start_time.timestamp() < since - 1:
        return None
    return incidents.OpenedIncident(
        incident_id=desc.typed_search_attributes.get(temporal.INCIDENT_ID) or "?",
        workflow_id=desc.id,
        run_id=desc.run_id,
        joined=False,
    )


async def restarted_job(slurm: SlurmCli, job_id: int, log: Path) -> tuple[SlurmJob, float] | None:
    job = await job_of(slurm, job_id)
    if job is None or job.job_state != "RUNNING" or job.restart_cnt < 1:
        return None
    ts = first_progress_after_restart(log, job.restart_cnt)
    return (job, ts) if ts else None


def print_new_steps(console: Console, state: IncidentState, shown: set[str]) -> None:
    start = state.request.opened_at
    for s in state.steps:
        if s.finished_at is None or s.name in shown:
            continue
        shown.add(s.name)
        took = (s.finished_at - s.started_at).total_seconds()
        at = (s.finished_at - start).total_seconds()
        colour = "green" if s.outcome == "ok" else "red"
        outcome = f"[{colour}]{s.outcome:>6}[/{colour}]"
        console.print(f"   {outcome} {s.name:<22} {took:7.2f}s  (t+{at:.1f}s) {s.detail}")
