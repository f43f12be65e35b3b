"""Recovery benchmark: K incidents in a sandbox, each a fault on a node of a running job.

Prints, per phase, the median and p95 seconds from the fault (detection, quarantine, job
requeued, job running again, repair, health gate, back in service); the steps the job did
again and the work lost per fault (seconds until it ran again plus its recomputed steps);
per fault, the recovery planner's estimate beside that loss in GPU-hours, and how many
faults' estimates were within ±30 % of it (bench/mttr_planner.py);
the orchestration overhead (incident time spent outside every external call and deliberate
wait); and, on the requeue path, the job's effective training time ratio over the whole run.
Writes a PNG timeline.

    .venv/bin/python bench/mttr.py --incidents 5 --boot-delay 0 --out docs/recovery
    .venv/bin/python bench/mttr.py --incidents 5 --boot-delay 0 --job-recovery in-job
    .venv/bin/python bench/mttr.py --incidents 3 --boot-delay 60 --k8s --out /tmp/mttr

`--job-recovery requeue` (default): one 2-node job, requeued by Slurm at each fault; the
job's log splits its restart (the batch script launched again, its checkpoint loaded).
`--job-recovery in-job`: for each fault a fresh job of examples/training's in-job mode (2
nodes train, a standby in the allocation: one standby covers one fault), faulted on a
training node; the runbook takes the node from the job and the standby takes its seat.
`--job-recovery borrowed` (bench/mttr_borrowed.py: Kubernetes mode, 4 nodes, 2 of them
serving inference under a steady load): one 2-node job, no spare; each fault's GPU stays
broken until a replacement, the sharing workflow lends the job an inference node for the repair
and gives it back after; the requests inference failed are counted per fault. It needs
boots long enough for the job to start on the borrowed node before the repair ends:

    .venv/bin/python bench/mttr.py --incidents 5 --boot-delay 30 --job-recovery borrowed

`--effect crash|hang|lost|slow|none` (default: the fault's realistic one,
sandbox/machines/fault_effects.py: XID_79 hangs) is what the fault does to the job's ranks on
the node; `--batch-host-every N`
puts every Nth fault on the job's batch host (the runbook requeues such a job at once, in
either path), e.g. 5 of 20 with N=4:

    .venv/bin/python bench/mttr.py --incidents 20 --gap 5 --job-recovery in-job --effect lost \
        --batch-host-every 4

A phase's tail is its p95 over 20 faults or more, else the largest of the n ("max of n").

`--record FILE` writes the per-fault figures, the command line and the machine's load as
JSON (bench/recovery_plot.py draws the paths side by side from such files).

Set beside Crusoe's published "detect, replace and resume in under 15 minutes": the boot
delay stands for the replacement VM's boot; 0 s, 60 s and 300 s bracket what clouds take.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # mttr_borrowed

from mttr_borrowed import BorrowedFault, borrowed_faults  # noqa: E402
from mttr_planner import planner_line, planner_row, planner_summary  # noqa: E402
from rich.console import Console  # noqa: E402
from temporalio.client import Client  # noqa: E402

from autoclusters.activities.job_markers import ACTIVE  # noqa: E402
from autoclusters.clients import incidents  # noqa: E402
from autoclusters.clients.agent import fake_backend  # noqa: E402
from autoclusters.core import hostlist  # noqa: E402
from autoclusters.core.models import IncidentState, SlurmJob  # noqa: E402
from autoclusters.core.policy import Policy  # noqa: E402
from autoclusters.core.recovery_cost import RecoveryFigures  # noqa: E402
from autoclusters.core.settings import Settings, load_file, policy_for  # noqa: E402
from autoclusters.integrations import temporal  # noqa: E402
from autoclusters.integrations.slurm import SlurmCli  # noqa: E402
from autoclusters.sandbox import cluster  # noqa: E402
from autoclusters.sandbox.drivers.demo import incident_since, wait_for  # noqa: E402
from autoclusters.sandbox.machines import fault_effects, training_job  # noqa: E402
from autoclusters.sandbox.machines.fault_effects import Effect  # noqa: E402
from autoclusters.sandbox.machines.hardware import HardwareFault  # noqa: E402
from autoclusters.sandbox.machines.joblog import (  # noqa: E402
    event_at,
    first_progress_after_reforming,
    first_progress_after_restart,
    progress_lines,
    training_nodes,
    went_on_from,
)
from autoclusters.sandbox.machines.vms import VmRegistry  # noqa: E402
from autoclusters.sandbox.runtime.config import SandboxConfig  # noqa: E402
from autoclusters.workflows.remediation import NodeRemediation  # noqa: E402

PHASES = [
    "detection",
    "quarantine",
    "job requeued",
    # The requeue path's restart. From slurmctld's log: the old run's processes all ended
    # (Slurm requeues it then), the job given nodes again (after the runbook's hold release
    # and its grace). From the job's log: the batch script launched again, then its ranks
    # up, met and loaded their checkpoint (torch imported, c10d rendezvous).
    "old run ended",
    "job allocated again",
    "job relaunched",
    "checkpoint loaded",
    "borrowed node lent",
    "job running again",  # its first step at full width
    "steps done again",
    "work lost (s)",
    "repair",
    "health gate",
    "back in service",
    "borrowed node given back",
    "job off the borrowed node",  # its first step on the repaired node
    "steps done again at give-back",
    "requests failed",  # inference's, over the fault's cycle
]


def _since(state: IncidentState, step: str, fault_at: float, last: bool = False) -> float | None:
    recs = [s for s in state.steps if s.name == step and s.finished_at]
    if not recs:
        return None
    rec = recs[-1] if last else recs[0]
    assert rec.finished_at is not None
    return rec.finished_at.timestamp() - fault_at


def _span(state: IncidentState, step: str) -> float:
    return sum(
        (s.finished_at - s.started_at).total_seconds()
        for s in state.steps
        if s.name == step and s.finished_at
    )


def overhead(state: IncidentState) -> float:
    """Incident time outside every step (each step is an external call or a deliberate wait)."""
    assert state.closed_at is not None
    spans = sorted(
        (s.started_at.timestamp(), s.finished_at.timestamp()) for s in state.steps if s.finished_at
    )
    covered, end = 0.0, state.request.opened_at.timestamp()
    for a, b in spans:
        if b > end:
            covered += b - max(a, end)
            end = b
    return state.closed_at.timestamp() - state.request.opened_at.timestamp() - covered


def pct(values: list[float], q: float) -> float:
    vs = sorted(values)
    return vs[min(len(vs) - 1, round(q * (len(vs) - 1)))]


TAIL_N = 20  # below this many, a p95 is only the largest value: say so


def stats(values: list[float]) -> dict[str, Any]:
    """Median, tail and n: the tail is the p95 over 20 values or more, else the largest
    (`tail_name` says which; bench/recovery_plot.py reads it as `p95`)."""
    n = len(values)
    tail = pct(values, 0.95) if n >= TAIL_N else max(values)
    return {"median": statistics.median(values), "p95": tail, "n": n}


def tail_name(n: int) -> str:
    return "p95" if n >= TAIL_N else f"max of {n}"


def _stat_line(name: str, s: dict[str, Any], digits: int = 2) -> str:
    med, tail, n = s["median"], s["p95"], s["n"]
    return f"{name:<32}{med:>9.{digits}f}{tail:>9.{digits}f}{n:>4}  {tail_name(n)}"


def sandbox_config(
    args: argparse.Namespace,
    faults: int,
    prefix: str,
    *,
    nodes: int | None = None,
    k8s: bool = False,
) -> SandboxConfig:
    """The bench's sandbox (`--state-dir`, `--port-base`, `--boot-delay` of `args`)."""
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix=prefix))
    cfg = SandboxConfig(
        state_dir=state_dir,
        cluster="bench",
        nodes=nodes or args.nodes,
        port_base=args.port_base,
        boot_delay_s=args.boot_delay,
        k8s=k8s,
        # The bench opens a fault every few seconds on purpose: more than the shipped
        # breaker's 5 in 10 minutes is the benchmark, not a fleet-wide problem.
        breaker_threshold=max(5, faults + 1),
    )
    print(f"sandbox in {state_dir} ({cfg.nodes} nodes, boot delay {args.boot_delay:.0f} s)")
    return cfg


async def run(args: argparse.Namespace) -> int:
    borrowed = args.job_recovery == "borrowed"
    # The borrowed path is the borrow demo's: 2 nodes train, 2 serve inference.
    cfg = sandbox_config(
        args, args.incidents, "mttr-", nodes=max(args.nodes, 4) if borrowed else None,
        k8s=args.k8s or borrowed,
    )  # fmt: skip
    machine = {"cpus": os.cpu_count(), "load_before": load()}
    await asyncio.to_thread(cluster.up, cfg)
    try:
        if borrowed:
            rows, timelines, kind = await _bench_borrowed(cfg, args)
            overheads, ratio = [overhead(t[2]) for t in timelines], None
        else:
            rows, overheads, timelines, kind, ratio = await _bench(cfg, args)
    finally:
        await asyncio.to_thread(cluster.down, cfg)
    machine["load_after"] = load()
    summary = report(rows, overheads, ratio)
    effect = fault_effects.parse_effect(args.effect, args.fault)
    print(
        f"boot delay {args.boot_delay:.0f} s; incidents {args.incidents}; k8s {cfg.k8s}; "
        f"job {kind}; job recovery {args.job_recovery}; fault {args.fault}, effect {effect}; "
        f"batch host every {args.batch_host_every or '-'}; {machine['cpus']} CPUs, load "
        f"average {machine['load_before']} before, {machine['load_after']} after"
    )
    if args.out:
        png = _plot(timelines, Path(args.out))
        print(f"timeline: {png}")
    if args.record:
        record = {
            "path": args.job_recovery,
            "fault": args.fault,
            "effect": effect,
            "command": " ".join(["bench/mttr.py", *sys.argv[1:]]),
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine,
            "job": kind,
            "boot_delay_s": args.boot_delay,
            "k8s": cfg.k8s,
            "rows": rows,
            "summary": summary,
            "effective_training_ratio": ratio,
            "recovery_figures": args.recovery_figures,
        }
        Path(args.record).write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")
    return 0


def load() -> list[float]:
    """The machine's load average (1, 5, 15 min): what the figures were measured beside."""
    return [round(v, 2) for v in os.getloadavg()]


Row = dict[str, Any]  # a phase's seconds (None: not reached), and what the fault was
Timeline = tuple[str, float, IncidentState, float]


class Rig:
    """What a bench drives in its sandbox: the settings, the policy, Slurm and Temporal."""

    def __init__(self, cfg: SandboxConfig, settings: Settings, policy: Policy, client: Client):
        self.cfg, self.settings, self.policy, self.client = cfg, settings, policy, client
        self.slurm = SlurmCli(cfg.slurm_conf)

    @classmethod
    async def connect(cls, cfg: SandboxConfig, figures: dict[str, float] | None = None) -> Rig:
        """`figures`: the recovery planner's seconds per path (`--recovery-figures`), over
        the shipped policy's, e.g. this machine's medians from an earlier run."""
        settings = load_file(cfg.settings_file)
        # Each incident is a fresh fault: no recurrence escalation between bench incidents.
        policy = policy_for(settings).model_copy(update={"recurrence_window_s": 0.001})
        if figures:
            merged = {**policy.recovery_figures.model_dump(), **figures}
            policy = policy.model_copy(
                update={"recovery_figures": RecoveryFigures.model_validate(merged)}
            )
        cfg.policy_file.write_text(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False))
        return cls(cfg, settings, policy, await temporal.connect(settings))

    async def fault(
        self, node: str, fault: str, effect: Effect, job_id: int
    ) -> tuple[float, incidents.OpenedIncident]:
        """A fault on the node's machine with its effect on the job's ranks there
        (sandbox/machines/fault_effects.py); the node's agent detects and reports it. A fault the
        agent cannot see (or a node with no machine) is reported through the API. Returns
        the fault's time and its incident."""
        cfg, vm = self.cfg, VmRegistry(self.cfg.state_dir).get(node)
        fault_at = time.time()
        if vm is not None and _agent_sees(fault):
            await asyncio.to_thread(
                fault_effects.inject, cfg, node, vm.vm_id, HardwareFault(fault=fault), effect,
                job_id=job_id,
            )  # fmt: skip
            opened = await wait_for(
                "the agent's report",
                lambda: incident_since(self.client, cfg.cluster, node, fault_at),
                60, 0.05,
            )  # fmt: skip
            return fault_at, opened
        await asyncio.to_thread(fault_effects.apply, cfg, node, effect, job_id=job_id)
        opened = await incidents.open_incident(
            self.client, self.settings, node, fault, opened_by="bench", policy=self.policy
        )
        return fault_at, opened

    async def outcome(self, opened: incidents.OpenedIncident) -> IncidentState:
        handle = self.client.get_workflow_handle_for(
            NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
        )
        return await handle.result()


def _agent_sees(fault: str) -> bool:
    return fault.startswith("XID_") or fault in fake_backend.injectable()


def on_batch_host(k: int, every: int) -> bool:
    """`--batch-host-every N`: the Nth, 2Nth, ... fault (k counts from 0) is on the batch host."""
    return every > 0 and (k + 1) % every == 0


async def _bench(
    cfg: SandboxConfig, args: argparse.Namespace
) -> tuple[list[Row], list[float], list[Timeline], str, float | None]:
    rig = await Rig.connect(cfg, json.loads(args.recovery_figures or "{}"))
    slurm = rig.slurm
    effect = fault_effects.parse_effect(args.effect, args.fault)
    in_job = args.job_recovery == "in-job"
    if not in_job:
        job_id, log, kind = await training_job.submit(slurm, cfg, "bench")
        print(f"job {job_id} ({kind}), log {log}")
    rows: list[Row] = []
    overheads: list[float] = []
    timelines: list[Timeline] = []
    run_start = time.time()
    for k in range(args.incidents):
        batch_host = on_batch_host(k, args.batch_host_every)
        if in_job:  # one standby covers one fault: a fresh job each time
            job_id, log, kind = await training_job.submit(slurm, cfg, f"bench{k}", in_job=True)
            job = await job_running(slurm, job_id, 0)
            await job_stepping(slurm, job_id, log, 0)
            await asyncio.sleep(args.gap)
            # A training node: the last (not the standby, nor the batch host: the first).
            node = (
                job.batch_host or min(training_nodes(log))
                if batch_host
                else max(training_nodes(log))
            )
            restarts = 0
        else:
            job = await job_running(slurm, job_id, k)
            await job_stepping(slurm, job_id, log, k)  # stepping, not just launched
            await asyncio.sleep(args.gap)  # let it train between faults
            nodes = hostlist.expand(job.nodes)
            others = [n for n in nodes if n != job.batch_host] or nodes
            node = job.batch_host or nodes[0] if batch_host else random.choice(others)
            restarts = k
        fault_at, opened = await rig.fault(node, args.fault, effect, job_id)
        state = await rig.outcome(opened)
        path = state.recovery_path.get(job_id)
        relaunched = loaded = None
        ctld: dict[str, float] = {}
        if in_job and path == "in-job":
            line = await _reformed(log, fault_at)
            resumed, resumed_at_step = line.ts, line.resumed_from
            before = [ln.step for ln in progress_lines(log) if ln.elastic < line.elastic]
        else:  # requeued (in-job mode: a fault on the batch host)
            resumed = await job_stepping(slurm, job_id, log, restarts + 1)
            resumed_at_step = went_on_from(log, restarts + 1)
            before = [ln.step for ln in progress_lines(log) if ln.restart <= restarts]
            relaunched = event_at(log, "launch", restarts + 1)
            loaded = event_at(log, "resumed", restarts + 1)
            ctld = slurmctld_restart(cfg.log_dir / "slurmctld.log", job_id, fault_at)
        if in_job:
            await slurm.cancel(job_id)
            await _gone(slurm, job_id)
        redone = max(before) - resumed_at_step if before and resumed_at_step is not None else None
        period = _step_period(log)
        rows.append(
            {
                "detection": state.request.opened_at.timestamp() - fault_at,
                "quarantine": _since(state, "drain", fault_at),
                "job requeued": _since(state, "requeue", fault_at),
                "old run ended": ctld["ended"] - fault_at if "ended" in ctld else None,
                "job allocated again": (
                    ctld["allocated"] - fault_at if "allocated" in ctld else None
                ),
                "job relaunched": relaunched - fault_at if relaunched else None,
                "checkpoint loaded": loaded - fault_at if loaded else None,
                "job running again": resumed - fault_at,
                "steps done again": redone,
                "work lost (s)": resumed - fault_at + (redone or 0) * period,
                "repair": _span(state, "repair"),
                "health gate": _span(state, "health_gate"),
                "back in service": _since(state, "return_to_service", fault_at, last=True),
                "node": node,
                "batch host": node == job.batch_host,
                "effect": effect,
                "recovery path": path,
                "status": state.status,
            }
        )
        rows[-1]["planner"] = planner_row(state, job_id, path, rows[-1]["work lost (s)"])
        overheads.append(overhead(state))
        timelines.append((f"#{k + 1} {node}", fault_at, state, resumed - fault_at))
        print(
            f"incident {k + 1}/{args.incidents}: {opened.incident_id} {state.status} "
            f"{node}{' (batch host)' if rows[-1]['batch host'] else ''} {effect}: {path}, "
            f"job again +{rows[-1]['job running again']:.1f}s, "
            f"node back +{rows[-1]['back in service'] or float('nan'):.1f}s"
        )
        print(planner_line(rows[-1]["planner"]))
    run_end = time.time()
    ratio = None if in_job else _effective_ratio(log, run_start, run_end)
    if not in_job:
        await slurm.cancel(job_id)
    return rows, overheads, timelines, kind, ratio


async def _bench_borrowed(
    cfg: SandboxConfig, args: argparse.Namespace
) -> tuple[list[Row], list[Timeline], str]:
    rig, faults = await borrowed_faults(cfg, args.incidents, args.gap, Console())
    period = _step_period(rig.log)
    rows = [_borrowed_row(f, period) for f in faults]
    timelines = [
        (f"#{k + 1} {f.node}", f.fault_at, f.state, f.job_again) for k, f in enumerate(faults)
    ]
    return rows, timelines, rig.kind


def _borrowed_row(f: BorrowedFault, period: float) -> Row:
    state, at = f.state, f.fault_at
    return {
        "detection": state.request.opened_at.timestamp() - at,
        "quarantine": _since(state, "drain", at),
        "job requeued": _since(state, "requeue", at),
        "borrowed node lent": f.lent,
        "job running again": f.job_again,
        "steps done again": f.redone,
        "work lost (s)": f.job_again + (f.redone or 0) * period,
        "repair": _span(state, "repair"),
        "health gate": _span(state, "health_gate"),
        "back in service": _since(state, "return_to_service", at, last=True),
        "borrowed node given back": f.given_back,
        "job off the borrowed node": f.off_borrowed,
        "steps done again at give-back": f.redone_at_give_back,
        "requests failed": f.requests_failed,
        "requests sent": f.requests,
        "steps on the borrowed node": f.steps_on_borrowed,
    }


def report(rows: list[Row], overheads: list[float], ratio: float | None) -> dict[str, Any]:
    """Print each phase's median, p95 and n over the faults that reached it; return them."""
    summary: dict[str, Any] = {}
    print()
    print(f"{'phase (s from the fault)':<32}{'median':>9}{'tail':>9}{'n':>4}  tail is")
    for phase in PHASES:
        vals = [v for r in rows if (v := r.get(phase)) is not None]
        if vals:
            summary[phase] = stats(vals)
            print(_stat_line(phase, summary[phase]))
    if overheads:
        summary["orchestration overhead"] = stats(overheads)
        print(_stat_line("orchestration overhead", summary["orchestration overhead"], 3))
    # The job's recovery apart for faults on the batch host (requeued at once) and elsewhere.
    groups: dict[str, list[float]] = {}
    for r in rows:
        if "batch host" in r and r.get("job running again") is not None:
            where = "batch host" if r["batch host"] else "other node"
            groups.setdefault(f"{where}, {r['recovery path']}", []).append(r["job running again"])
    if len(groups) > 1 or any(r.get("batch host") for r in rows):
        print("job running again, by where the fault was and the path the job took:")
        for name, vals in sorted(groups.items()):
            summary[f"job running again ({name})"] = stats(vals)
            print(_stat_line(f"  {name}", summary[f"job running again ({name})"]))
    bad = [r for r in rows if r.get("status") not in (None, "resolved")]
    if bad:
        print(f"incidents not resolved: {len(bad)} ({', '.join(str(r['status']) for r in bad)})")
    sent = [v for r in rows if (v := r.get("requests sent")) is not None]
    if sent:
        failed = sum(r.get("requests failed") or 0 for r in rows)
        print(f"inference requests over the faults: {sum(sent):.0f} sent, {failed:.0f} failed")
    if ratio is not None:
        print(f"effective training time ratio over the run: {ratio:.3f}")
    planned = [r["planner"] for r in rows if "planner" in r]
    if planned:
        line, summary["planner"] = planner_summary(planned)
        print(line)
    return summary


_CTLD_LINE = re.compile(r"^\[(\S+)\] (.*)$")


def slurmctld_restart(log: Path, job_id: int, after: float) -> dict[str, float]:
    """From slurmctld's log, the first time after `after` that Slurm requeued the job
    (`ended`: its old run's processes are all gone) and then allocated it nodes again
    (`allocated`). Its stamps are local time, to the millisecond. A phase not (yet) logged,
    or a log not readable, is absent: unknown."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    requeued = re.compile(rf"\bRequeuing JobId={job_id}\b")
    allocated = re.compile(rf"\bAllocate JobId={job_id} ")
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _CTLD_LINE.match(line)
        if not m:
            continue
        try:
            ts = datetime.fromisoformat(m[1]).timestamp()
        except ValueError:
            continue
        if ts < after:
            continue
        if "ended" not in out and requeued.search(m[2]):
            out["ended"] = ts
        elif "ended" in out and allocated.search(m[2]):
            out["allocated"] = ts
            break
    return out


def _effective_ratio(log: Path, start: float, end: float) -> float:
    """The steps that counted over the steps an unbroken job would have made.

    Every rank logs each step: a (run, step) pair counts once. The stand-in job keeps no
    checkpoint, so a requeued run starts again from step 0 and only new steps count:
    progress is the most steps any run reached plus nothing redone. A checkpointing job
    (examples/training) logs `resumed_from`, and its progress is its last step.
    """
    lines = [ln for ln in progress_lines(log) if start <= ln.ts <= end]
    first: dict[tuple[int, int], float] = {}
    for ln in lines:
        first.setdefault((ln.restart, ln.step), ln.ts)
    if len(first) < 3:
        return 0.0
    run0 = sorted(ts for (r, _), ts in first.items() if r == lines[0].restart)
    period = statistics.median(b - a for a, b in zip(run0, run0[1:], strict=False))
    last = max(first, key=first.__getitem__)  # the latest (run, step) logged
    resumed = [ln.resumed_from for ln in lines if ln.restart == last[0] and ln.resumed_from]
    # Progress: a checkpointing job continues its step count; the stand-in restarts at 0.
    progress = last[1] if resumed else max(step for (_, step) in first) + 1
    ideal = (end - start) / period
    return min(1.0, progress / ideal)


def _step_period(log: Path) -> float:
    """Seconds per step of the job's first run (its --step-sleep plus the step)."""
    ts = sorted({ln.step: ln.ts for ln in progress_lines(log) if ln.restart == 0}.values())
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False)]
    return statistics.median(gaps) if gaps else 0.0


async def _reformed(log: Path, fault_at: float) -> Any:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if line := first_progress_after_reforming(log, fault_at):
            return line
        await asyncio.sleep(0.1)
    raise RuntimeError("the in-job group never stepped again")


async def _gone(slurm: SlurmCli, job_id: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # squeue --json lists ended jobs too, for MinJobAge: gone is no longer active.
        if not any(j.job_id == job_id and j.job_state in ACTIVE for j in await slurm.jobs()):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"job {job_id} did not leave the queue")


async def job_running(slurm: SlurmCli, job_id: int, restarts: int) -> SlurmJob:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        job = next((j for j in await slurm.jobs() if j.job_id == job_id), None)
        if job and job.job_state == "RUNNING" and job.restart_cnt >= restarts:
            return job
        await asyncio.sleep(0.5)
    raise RuntimeError(f"job {job_id} is not running")


async def job_stepping(slurm: SlurmCli, job_id: int, log: Path, restart: int) -> float:
    await job_running(slurm, job_id, restart)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ts = first_progress_after_restart(log, restart)
        if ts:
            return ts
        await asyncio.sleep(0.2)
    raise RuntimeError("the job never logged progress again")


def _plot(timelines: list[tuple[str, float, IncidentState, float]], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    colours = {
        "drain": "#d62728", "requeue": "#ff7f0e", "wait_idle": "#bcbd22", "repair": "#1f77b4",
        "wait_registered": "#17becf", "health_gate": "#2ca02c", "return_to_service": "#9467bd",
    }  # fmt: skip
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(timelines) + 1.5))
    for i, (_label, fault_at, state, job_again) in enumerate(timelines):
        ax.plot([job_again], [i], marker="v", color="black", markersize=9, zorder=3)
        for s in state.steps:
            if s.finished_at is None:
                continue
            a = s.started_at.timestamp() - fault_at
            w = max((s.finished_at - s.started_at).total_seconds(), 0.05)
            ax.barh(i, w, left=a, color=colours.get(s.name, "#c7c7c7"), edgecolor="none")
    ax.set_yticks(range(len(timelines)), [t[0] for t in timelines])
    ax.invert_yaxis()
    ax.set_xlabel("seconds after the fault")
    ax.set_title("AutoClusters incidents: steps after the fault")
    handles: list[Any] = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    handles.append(plt.Line2D([], [], marker="v", color="black", linestyle=""))
    ax.legend(handles, [*colours, "job steps again"], loc="lower right", fontsize=7)
    fig.tight_layout()
    path = out / f"timeline-{datetime.now():%Y%m%d-%H%M%S}.png"
    fig.savefig(path, dpi=110)
    return path


def interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--incidents", type=int, default=5)
    p.add_argument("--boot-delay", type=float, default=0)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--fault", default="XID_79")
    p.add_argument(
        "--effect",
        default="default",
        help="what the fault does to the job's ranks on the node: crash, hang, lost, slow, "
        "none, or default (the fault's realistic effect: XID_79 hangs)",
    )
    p.add_argument(
        "--batch-host-every",
        type=int,
        default=0,
        metavar="N",
        help="every Nth fault on the job's batch host (4: 5 of 20); 0: never",
    )
    p.add_argument("--gap", type=float, default=30, help="seconds of training between faults")
    p.add_argument("--k8s", action="store_true")
    p.add_argument("--job-recovery", choices=["requeue", "in-job", "borrowed"], default="requeue")
    p.add_argument("--port-base", type=int, default=17400)
    p.add_argument("--state-dir", default=None)
    p.add_argument("--out", default=None, help="folder for the PNG timeline")
    p.add_argument("--record", default=None, help="JSON file for the per-fault figures")
    p.add_argument(
        "--recovery-figures",
        default=None,
        metavar="JSON",
        help="the recovery planner's seconds per path over the shipped policy's, e.g. "
        '\'{"in_job_s": 1.3, "requeue_s": 15}\' (this machine\'s medians from an earlier run)',
    )
    args = p.parse_args()
    # A bench stopped with SIGTERM (a timeout, a CI job cancelled) still takes its sandbox
    # down: the signal becomes the KeyboardInterrupt that asyncio.run turns into the main
    # task's cancellation, and run()'s `finally` stops every process by its PID.
    signal.signal(signal.SIGTERM, interrupt)
    rc = asyncio.run(run(args))
    sys.stdout.flush()
    os._exit(rc)  # Temporal's threads can crash a finishing interpreter (sdk-python#300)


if __name__ == "__main__":
    main()
