"""`demo --scenario hang|slow`: a silent fault on a training rank, found by the job's own
progress, and handled.

The in-job example job (examples/training: 2 nodes train, a standby in the allocation)
publishes its ranks' progress to the sandbox's progress directory, which the nodes' agents
read (sandbox/runtime/daemons.py). One training rank then hangs (SIGSTOP, its connections silent)
or runs `factor` times slower (a duty cycle), with nothing wrong in the node's hardware
readings (sandbox/machines/job_faults.py). The agents' progress rules open JOB_HANG or SLOW_NODE on
the node they name (clients/agent/progress_rules.py); the runbook does with it what its
policy says; the demo waits for the incident to end and reports: which node was named, by
which rule, how long detection took (`detect_s`) and how long until the job stepped again
at full speed without the faulty rank (`job_recovery_s`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from pydantic import BaseModel
from rich.console import Console
from temporalio.client import Client, WorkflowFailureError

from autoclusters.clients import incidents
from autoclusters.clients.agent.progress_rules import JOB_HANG, PROGRESS_KINDS, SLOW_NODE
from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState, SlurmJob
from autoclusters.core.settings import load_file
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import cluster
from autoclusters.sandbox.cluster import sandbox_policy
from autoclusters.sandbox.drivers.demo import (
    DemoError,
    ScreenSummary,
    StepSummary,
    incident_since,
    job_of,
    print_new_steps,
    restarted_job,
    screen_summary,
    wait_for,
)
from autoclusters.sandbox.machines import job_faults, training_job
from autoclusters.sandbox.machines.joblog import (
    ProgressLine,
    first_progress_after_reforming,
    progress_lines,
    training_nodes,
)
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workflows.remediation import NodeRemediation

SCENARIOS = ("hang", "slow")
EXPECTED = {"hang": JOB_HANG, "slow": SLOW_NODE}
JOB_PROGRESS = "job-progress"  # the detection path: the agent, from the jobs' progress
# Detection may take the hang threshold's floor (25 s) or the straggler's window (10 slow
# steps of ~2 s) plus the agent's read interval; this bounds the wait generously.
DETECT_TIMEOUT_S = 120
# Steps the job makes before the fault: past its first checkpoint (a requeue resumes from
# it) and with a step-time window for the rules to compare.
WARM_STEPS = training_job.CKPT_EVERY + 3
# A requeued job may wait out Slurm's 120 s requeue delay when its hold is not released.
RECOVERY_TIMEOUT_S = 240


class SilentDemoSummary(BaseModel):
    scenario: str  # hang | slow
    incident_id: str
    status: str
    rung: str | None
    # The node whose rank was faulted, and the node the incident opened on (the right one
    # when they are equal).
    node: str
    named_node: str
    other_nodes_named: list[str]  # other nodes with an incident since the fault
    right_node: bool
    fault: str  # what the incident opened with: JOB_HANG or SLOW_NODE
    expected_fault: str
    fault_effect: str  # hang | slow (sandbox/machines/job_faults.py)
    slow_factor: float | None
    # job-progress: the node agent's report from the jobs' progress; else the source name.
    detected_by: str
    rule: str | None  # the rule that named the node (heartbeat, not_in_collective, ...)
    detect_s: float  # the fault -> the incident opened
    job_recovery_s: float | None  # the fault -> the job stepping at full speed without it
    recovery_path: str | None
    job_id: int
    job: str
    job_restarts: int
    resumed_from_step: int | None
    # Median seconds between the job's steps: before the fault, between the fault and the
    # incident, after the recovery.
    step_s_before: float | None
    step_s_faulted: float | None
    step_s_after: float | None
    job_nodes_before: list[str]
    job_nodes_after: list[str]
    health_gates: list[bool]
    screen: ScreenSummary | None = None
    temporal_ui: str
    steps: list[StepSummary]


def detection_path(opened_by: str, fault: str) -> str:
    """`job-progress` when the node agent opened the incident with a fault it finds in the
    jobs' progress; otherwise the source's own name."""
    return JOB_PROGRESS if opened_by == "agent" and fault in PROGRESS_KINDS else opened_by


def opening_rule(state: IncidentState) -> str | None:
    """The rule the agent's first report of the opening fault gave (progress_rules.py)."""
    for seen in state.faults:
        if seen.fault != state.request.fault:
            continue
        for ev in seen.evidence:
            subjects = ev.readings.get("subjects")
            if isinstance(subjects, list) and subjects and isinstance(subjects[0], dict):
                rule = subjects[0].get("rule")
                return rule if isinstance(rule, str) else None
    return None


async def steps_after(log: Path, ts: float, steps: int = 6, timeout_s: float = 30) -> None:
    """Wait (at most `timeout_s`) until the job logged `steps` step lines since `ts`."""

    async def enough() -> bool:
        return sum(p.ts >= ts for p in progress_lines(log)) >= steps

    try:
        await wait_for(f"{steps} steps", enough, timeout_s)
    except DemoError:
        pass  # the summary says what there was: a step time of None


def median_step_s(lines: list[ProgressLine], start: float, end: float) -> float | None:
    """The median time between one node's consecutive step lines (same run and group)
    logged in [start, end): the job's step time there; None with fewer than two."""
    gaps: list[float] = []
    by_node: dict[str, list[ProgressLine]] = {}
    for p in lines:
        if start <= p.ts < end:
            by_node.setdefault(p.node, []).append(p)
    for mine in by_node.values():
        for a, b in zip(mine, mine[1:], strict=False):
            if (a.restart, a.elastic) == (b.restart, b.elastic) and b.step == a.step + 1:
                gaps.append(b.ts - a.ts)
    return round(statistics.median(gaps), 3) if gaps else None


async def warm(slurm: SlurmCli, job_id: int, log: Path) -> SlurmJob | None:
    """The in-job job, running, both training nodes past WARM_STEPS; None until then."""
    job = await job_of(slurm, job_id)
    if not job or job.job_state != "RUNNING":
        return None
    return job if len(training_nodes(log, from_step=WARM_STEPS)) >= 2 else None


async def run_silent_demo(
    cfg: SandboxConfig, scenario: str, keep: bool, console: Console, factor: float = 2.0
) -> SilentDemoSummary:
    if scenario not in SCENARIOS:
        raise DemoError(f"scenario must be hang or slow, not {scenario!r}")
    if not training_job.torch_available():
        raise DemoError(
            "the hang and slow scenarios need the training job (torch: the `training` extra); "
            "the stand-in job publishes no progress"
        )
    job_faults.parse_factor(factor)
    was_running = cluster.is_running(cfg) if cfg.record_file.exists() else False
    console.print(f"[bold]1. sandbox[/bold] in {cfg.state_dir} ({cfg.nodes} nodes)")
    res = await asyncio.to_thread(cluster.up, cfg)
    console.print(
        "   already running" if res.already_running else f"   started {', '.join(res.started)}"
    )
    if res.already_running:
        cfg = SandboxConfig.load(cfg.state_dir)
    try:
        return await _demo(cfg, scenario, factor, console)
    finally:
        if not keep and not was_running:
            console.print("[bold]sandbox down[/bold]")
            await asyncio.to_thread(cluster.down, cfg)


async def _demo(
    cfg: SandboxConfig, scenario: str, factor: float, console: Console
) -> SilentDemoSummary:
    settings = load_file(cfg.settings_file)
    slurm = SlurmCli(cfg.slurm_conf)
    job_id, log, kind = await training_job.submit(slurm, cfg, scenario, in_job=True)
    console.print(
        f"[bold]2. job[/bold] {job_id}: 2 nodes train, a standby in the allocation; each rank "
        f"publishes its progress to {cfg.progress_dir}"
    )

    job = await wait_for("the job to train", lambda: warm(slurm, job_id, log), 240)
    before = hostlist.expand(job.nodes)
    node = max(training_nodes(log))  # a training node, not the batch host (the first)
    console.print(f"   job {job_id} training on {', '.join(sorted(training_nodes(log)))}; {log}")
    # New incidents read the policy file: the demo's node passes the burn-in screen before
    # it returns, as in the default demo.
    cfg.policy_file.write_text(sandbox_policy(cfg, mode="auto", burn_in=True))
    client = await temporal.connect(settings)
    what = "hangs (SIGSTOP, its connections silent)" if scenario == "hang" else (
        f"runs {factor:g}x slower (a SIGSTOP/SIGCONT duty cycle)"
    )  # fmt: skip
    console.print(
        f"[bold]3. silent fault[/bold] the job's rank on {node} {what}; no Xid, nothing in "
        "the node's hardware readings"
    )
    fault_at = time.time()
    effect = job_faults.parse_job_effect(scenario)
    await asyncio.to_thread(job_faults.inject, cfg, node, effect, factor=factor, job_id=job_id)
    opened, named = await wait_for(
        "the job's progress to open an incident",
        lambda: first_incident(client, cfg, fault_at),
        DETECT_TIMEOUT_S,
        0.2,
    )
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    first = await handle.query(NodeRemediation.status)
    right = "the right node" if named == node else "WRONG node"
    by = detection_path(first.request.opened_by, first.request.fault)
    console.print(
        f"   {first.request.fault} on {named} ({right}), opened by {by} "
        f"{first.request.opened_at.timestamp() - fault_at:.1f}s after the fault: incident "
        f"{opened.incident_id}"
    )
    result = asyncio.create_task(handle.result())
    shown: set[str] = set()
    while not result.done():
        print_new_steps(console, await handle.query(NodeRemediation.status), shown)
        await asyncio.wait({result}, timeout=0.5)
    try:
        final: IncidentState = result.result()
        status = final.status
    except WorkflowFailureError as e:
        console.print(f"[red]   incident failed: {e.cause}[/red]")
        final, status = await handle.query(NodeRemediation.status), "failed"
    print_new_steps(console, final, shown)
    others = [n for _o, n in await incidents_since(client, cfg, fault_at) if n != named]
    recovered = await recovery(slurm, job_id, log, fault_at, final)
    job_after, recovered_at, resumed_from = recovered if recovered else (job, None, None)
    if recovered_at is not None:
        await steps_after(log, recovered_at)  # for the step time after it
    lines = progress_lines(log)
    opened_ts = final.request.opened_at.timestamp()
    return SilentDemoSummary(
        scenario=scenario,
        incident_id=opened.incident_id,
        status=status,
        rung=final.rung,
        node=node,
        named_node=named,
        other_nodes_named=others,
        right_node=named == node and not others,
        fault=final.request.fault,
        expected_fault=EXPECTED[scenario],
        fault_effect=scenario,
        slow_factor=factor if scenario == "slow" else None,
        detected_by=detection_path(final.request.opened_by, final.request.fault),
        rule=opening_rule(final),
        detect_s=round(opened_ts - fault_at, 3),
        job_recovery_s=round(recovered_at - fault_at, 3) if recovered_at else None,
        recovery_path=final.recovery_path.get(job_id),
        job_id=job_id,
        job=kind,
        job_restarts=job_after.restart_cnt,
        resumed_from_step=resumed_from,
        step_s_before=median_step_s(lines, fault_at - 30, fault_at),
        step_s_faulted=median_step_s(lines, fault_at + 2, opened_ts),
        step_s_after=median_step_s(lines, recovered_at, time.time()) if recovered_at else None,
        job_nodes_before=before,
        job_nodes_after=hostlist.expand(job_after.nodes),
        health_gates=[h.passed for h in final.health],
        screen=screen_summary(final),
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


async def incidents_since(
    client: Client, cfg: SandboxConfig, since: float
) -> list[tuple[incidents.OpenedIncident, str]]:
    """The incidents opened on the sandbox's nodes since `since`, with their nodes: the demo
    and the bench report every node named, right or wrong."""
    found = []
    for name in cfg.node_names():
        if (opened := await incident_since(client, cfg.cluster, name, since)) is not None:
            found.append((opened, name))
    return found


async def first_incident(
    client: Client, cfg: SandboxConfig, since: float
) -> tuple[incidents.OpenedIncident, str] | None:
    found = await incidents_since(client, cfg, since)
    return found[0] if found else None


async def recovery(
    slurm: SlurmCli,
    job_id: int,
    log: Path,
    fault_at: float,
    final: IncidentState,
    timeout_s: float = RECOVERY_TIMEOUT_S,
) -> tuple[SlurmJob, float, int | None] | None:
    """The job going on without the faulty rank: its first step in a re-formed group (in
    job) or in its requeued run; None when the runbook did neither. DemoError past
    `timeout_s`."""
    path = final.recovery_path.get(job_id)
    if path == "in-job":

        async def reformed() -> ProgressLine | None:
            return first_progress_after_reforming(log, fault_at)

        line = await wait_for("the job to step again", reformed, timeout_s)
        job = await job_of(slurm, job_id)
        if job is None:
            raise DemoError(f"job {job_id} is gone from Slurm after its recovery")
        return job, line.ts, line.resumed_from
    if final.requeued_jobs:
        again, ts = await wait_for(
            "the job to step again", lambda: restarted_job(slurm, job_id, log), timeout_s
        )
        first = next((p for p in progress_lines(log) if p.restart >= again.restart_cnt), None)
        return again, ts, first.resumed_from if first else None
    return None


def print_silent_summary(s: SilentDemoSummary, out: Console) -> None:
    def secs(v: float | None) -> str:
        return f"{v:.1f} s" if v is not None else "n/a"

    out.print()
    out.print(f"[bold]incident[/bold]           {s.incident_id} ({s.status}; rung {s.rung})")
    verdict = "[green]right node[/green]" if s.right_node else "[red]WRONG node[/red]"
    out.print(
        f"silent fault       the rank on {s.node} {s.fault_effect}"
        + (f" ({s.slow_factor:g}x)" if s.slow_factor else "")
        + f"; named {s.named_node} ({verdict}) with {s.fault} by {s.detected_by}"
        + (f", rule {s.rule}" if s.rule else "")
    )
    if s.other_nodes_named:
        out.print(f"[red]also named[/red]         {', '.join(s.other_nodes_named)}")
    out.print(f"[bold]detection[/bold]          {secs(s.detect_s)}  (fault → incident)")
    out.print(
        f"[bold]job recovery[/bold]       {secs(s.job_recovery_s)}  (fault → the job steps at "
        f"full speed without the rank; {s.recovery_path or 'not recovered'})"
    )
    out.print(
        f"step time          {secs(s.step_s_before)} before, {secs(s.step_s_faulted)} faulted, "
        f"{secs(s.step_s_after)} after"
    )
    out.print(
        f"job {s.job_id}             restarts {s.job_restarts}: "
        f"{', '.join(s.job_nodes_before)} → {', '.join(s.job_nodes_after)}"
    )
    out.print(f"health gates       {s.health_gates}")
    out.print(f"Temporal UI        {s.temporal_ui}")
