"""Silent faults benchmark (issue 40): a hung rank and a 2x straggler found from the job's
own progress, on the right node, and a healthy run that opens nothing.

In one sandbox (Managed Slurm, 4 nodes), each trial a fresh job of examples/training's
in-job mode (2 nodes train, a standby in the allocation: one standby covers one fault),
faulted on a training node (not the batch host) with `sandbox job-fault` (no Xid, nothing
in the node's hardware readings: sandbox/machines/job_faults.py):

- hang: the rank stops (SIGSTOP, its connections silent). Measured: the fault -> the
  incident (JOB_HANG) on the right node, and -> the job stepping again without it;
- slow: the rank's steps take `--factor` (2) times longer. Measured: the fault ->
  SLOW_NODE on the right node, and -> the job stepping at full speed again (its first step
  without the slow rank: a re-formed group or its requeued run; the median step after it
  is in the record);
- healthy: one job for `--healthy-s` (1800) with its periodic checkpoint saves (every 5
  steps), an evaluation every rank declares (`--eval-s`, 40 s: longer than the hang floor,
  so the declared pause is what keeps it from a hang) and an undeclared stall of rank 0's
  data loader (`--stall-s`, 20 s) before the first evaluation and more than the rules'
  32-step window after the start (so that the hang floor, not an evaluation's step time,
  is what it is judged by). Counted: every incident opened.

Any incident on another node than the faulted one counts as a wrong node. A tail is the
p95 over 20 trials or more, else the largest of the n ("max of n"). Prints a table with
the targets and the machine's load average; `--record FILE` writes the per-trial figures,
the command and the load as JSON.

    .venv/bin/python bench/silent.py --trials 10 --record /tmp/silent.json
    .venv/bin/python bench/silent.py --trials 3 --healthy-s 180   # a quick run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # mttr

from mttr import Rig, load, sandbox_config, stats, tail_name  # noqa: E402

from autoclusters.activities.job_markers import ACTIVE  # noqa: E402
from autoclusters.integrations.slurm import SlurmCli  # noqa: E402
from autoclusters.sandbox import cluster  # noqa: E402
from autoclusters.sandbox.drivers.demo import DemoError, wait_for  # noqa: E402
from autoclusters.sandbox.drivers.silent_demo import (  # noqa: E402
    DETECT_TIMEOUT_S,
    EXPECTED,
    detection_path,
    first_incident,
    incidents_since,
    median_step_s,
    recovery,
    steps_after,
    warm,
)
from autoclusters.sandbox.machines import job_faults, training_job
from autoclusters.sandbox.machines.joblog import progress_lines, training_nodes  # noqa: E402
from autoclusters.sandbox.runtime.config import SandboxConfig  # noqa: E402
from autoclusters.workflows.remediation import NodeRemediation  # noqa: E402

# The targets (seconds from the fault).
TARGETS = {
    "hang -> incident": 30.0,
    "hang -> job stepping again": 40.0,
    "straggler -> SLOW_NODE": 60.0,
    "straggler -> full speed": 90.0,
}
MEASURES = {
    "hang": ("hang -> incident", "hang -> job stepping again"),
    "slow": ("straggler -> SLOW_NODE", "straggler -> full speed"),
}

Row = dict[str, Any]


async def trial(rig: Rig, cfg: SandboxConfig, kind: str, k: int, factor: float) -> Row:
    """One silent fault on a fresh in-job job; its figures."""
    slurm = rig.slurm
    job_id, log, _ = await training_job.submit(slurm, cfg, f"{kind}{k}", in_job=True)
    await wait_for("the job to train", lambda: warm(slurm, job_id, log), 240)
    node = max(training_nodes(log))  # a training node, not the batch host
    fault_at = time.time()
    effect = job_faults.parse_job_effect(kind)
    await asyncio.to_thread(job_faults.inject, cfg, node, effect, factor=factor, job_id=job_id)
    detect, again = MEASURES[kind]
    try:
        opened, named = await wait_for(
            "an incident", lambda: first_incident(rig.client, cfg, fault_at), DETECT_TIMEOUT_S, 0.1
        )
    except DemoError as e:  # a fault never found counts as not reached; the run goes on
        print(f"{kind} {k + 1}: {e} (on {node})", flush=True)
        await slurm.cancel(job_id)  # the fault ends with the job's processes
        await gone(slurm, job_id)
        return {
            "kind": kind, "node": node, "named": None, "other_nodes_named": [], "fault": None,
            "expected_fault": EXPECTED[kind], "status": "not opened", "recovery_path": None,
            detect: None, again: None,
        }  # fmt: skip
    state = await rig.client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    ).result()
    try:
        recovered = await recovery(slurm, job_id, log, fault_at, state)
    except DemoError as e:  # counted as not reached, the run goes on
        print(f"{kind} {k + 1}: {e}", flush=True)
        recovered = None
    if recovered:
        await steps_after(log, recovered[1])
    others = [n for _o, n in await incidents_since(rig.client, cfg, fault_at) if n != named]
    await slurm.cancel(job_id)
    await gone(slurm, job_id)
    at = recovered[1] if recovered else None
    lines = progress_lines(log)
    return {
        "kind": kind,
        "node": node,
        "named": named,
        "other_nodes_named": others,
        "fault": state.request.fault,
        "expected_fault": EXPECTED[kind],
        "detected_by": detection_path(state.request.opened_by, state.request.fault),
        "status": state.status,
        "recovery_path": state.recovery_path.get(job_id),
        detect: state.request.opened_at.timestamp() - fault_at,
        again: at - fault_at if at else None,
        "step_s_before": median_step_s(lines, fault_at - 30, fault_at),
        "step_s_faulted": median_step_s(lines, fault_at + 2, state.request.opened_at.timestamp()),
        "step_s_after": median_step_s(lines, at, at + 30) if at else None,
    }


def right(row: Row) -> bool:
    """The incident opened on the faulted node, with the expected fault, and on no other."""
    return bool(
        row["named"] == row["node"]
        and row["fault"] == row["expected_fault"]
        and not row["other_nodes_named"]
    )


async def healthy(rig: Rig, cfg: SandboxConfig, args: argparse.Namespace) -> Row:
    """A healthy job for `--healthy-s`: its saves, an evaluation, a data-loader stall."""
    seconds = args.healthy_s
    steps = int(seconds)  # ~1 s a step, less the pauses: enough to reach both
    # The stall first, more than the rules' 32-step window before any evaluation: its own
    # step-time tail is the checkpoints' (~1 s), so the hang floor is what it is judged by.
    stall_at = max(40, steps // 4)
    eval_every = 2 * stall_at
    train_args = (
        "--eval-every", str(eval_every), "--eval-s", str(args.eval_s),
        "--data-stall-at", str(stall_at), "--data-stall-s", str(args.stall_s),
    )  # fmt: skip
    job_id, log, _ = await training_job.submit(
        rig.slurm, cfg, "healthy", in_job=True, train_args=train_args
    )
    await wait_for("the job to train", lambda: warm(rig.slurm, job_id, log), 240)
    start = time.time()
    while time.time() - start < seconds:
        await asyncio.sleep(5)
    opened = [n for _o, n in await incidents_since(rig.client, cfg, start)]
    await rig.slurm.cancel(job_id)
    await gone(rig.slurm, job_id)
    lines = [p for p in progress_lines(log) if p.ts >= start]
    gaps = longest_gaps(lines)
    saves = sum(
        1 for ln in log.read_text(errors="replace").splitlines() if "event=checkpoint_saved" in ln
    )
    return {
        "kind": "healthy",
        "seconds": round(time.time() - start, 1),
        "incidents": opened,
        "steps": len({p.step for p in lines}),
        "checkpoints_saved": saves,
        "eval_every": eval_every,
        "eval_s": args.eval_s,
        "stall_at": stall_at,
        "stall_s": args.stall_s,
        "longest_gaps_s": gaps,
        "restarts": sorted({p.restart for p in lines}),
    }


def longest_gaps(lines: list[Any], n: int = 4) -> list[float]:
    """The `n` longest times between one node's consecutive steps: the evaluations and the
    stall show there (proof they happened)."""
    by_node: dict[str, list[Any]] = {}
    for p in lines:
        by_node.setdefault(p.node, []).append(p)
    gaps = [
        b.ts - a.ts
        for mine in by_node.values()
        for a, b in zip(mine, mine[1:], strict=False)
        if b.step == a.step + 1
    ]
    return [round(g, 1) for g in sorted(gaps, reverse=True)[:n]]


async def gone(slurm: SlurmCli, job_id: int) -> None:
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not any(j.job_id == job_id and j.job_state in ACTIVE for j in await slurm.jobs()):
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"job {job_id} did not leave the queue")


def summarise(rows: list[Row], health: Row | None) -> dict[str, Any]:
    """Per measure: median, tail, n, the target and whether the tail meets it; the right
    node counts; the healthy run's incidents."""
    out: dict[str, Any] = {}
    for name, target in TARGETS.items():
        values = [r[name] for r in rows if r.get(name) is not None]
        trials = [r for r in rows if name in r]
        if not values:
            out[name] = {"n": 0, "missing": len(trials), "target": target}
            continue
        s = stats(values)
        out[name] = {
            **s,
            "missing": len(trials) - len(values),
            "target": target,
            "met": s["p95"] <= target and len(values) == len(trials),
        }
    out["right node"] = {
        kind: f"{sum(right(r) for r in rows if r['kind'] == kind)}/"
        f"{sum(r['kind'] == kind for r in rows)}"
        for kind in MEASURES
    }
    out["wrong nodes named"] = sum(
        (r["named"] not in (None, r["node"])) + len(r["other_nodes_named"]) for r in rows
    )
    out["resolved"] = f"{sum(r['status'] == 'resolved' for r in rows)}/{len(rows)}"
    if health is not None:
        out["healthy run incidents"] = len(health["incidents"])
    return out


def table(summary: dict[str, Any], health: Row | None) -> str:
    lines = [f"{'':<30}{'median':>9}{'tail':>9}{'n':>4}  {'tail is':<10}{'target':>8}  met"]
    for name in TARGETS:
        s = summary[name]
        if not s["n"]:
            lines.append(f"{name:<30}{'-':>9}{'-':>9}{0:>4}  (none reached: {s['missing']})")
            continue
        miss = f", {s['missing']} not reached" if s["missing"] else ""
        lines.append(
            f"{name:<30}{s['median']:>9.1f}{s['p95']:>9.1f}{s['n']:>4}  "
            f"{tail_name(s['n']):<10}{s['target']:>7.0f}s  {'yes' if s['met'] else 'NO'}{miss}"
        )
    lines.append(
        f"right node (fault, node, no other): hang {summary['right node']['hang']}, "
        f"slow {summary['right node']['slow']}; wrong nodes named: "
        f"{summary['wrong nodes named']}; incidents resolved {summary['resolved']}"
    )
    if health is not None:
        lines.append(
            f"healthy run: {health['seconds']:.0f} s, {health['steps']} steps, "
            f"{health['checkpoints_saved']} checkpoints saved, an evaluation of "
            f"{health['eval_s']:g} s every {health['eval_every']} steps, a {health['stall_s']:g} s "
            f"data-loader stall at step {health['stall_at']} (longest gaps between steps: "
            f"{health['longest_gaps_s']} s): {len(health['incidents'])} incidents "
            f"{health['incidents'] or ''}"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> int:
    if not training_job.torch_available():
        print("bench/silent.py needs torch (the `training` extra): the stand-in publishes nothing")
        return 2
    cfg = sandbox_config(args, 2 * args.trials + 1, "silent-", nodes=4)
    machine: dict[str, Any] = {"cpus": os.cpu_count(), "load_before": load()}
    await asyncio.to_thread(cluster.up, cfg)
    rows: list[Row] = []
    health: Row | None = None
    try:
        rig = await Rig.connect(cfg)
        for k in range(args.trials):
            for kind in ("hang", "slow"):
                row = await trial(rig, cfg, kind, k, args.factor)
                rows.append(row)
                detect, again = MEASURES[kind]
                print(
                    f"{kind} {k + 1}/{args.trials}: {row['fault']} on {row['named']} (faulted "
                    f"{row['node']}) +{row[detect] or float('nan'):.1f}s, stepping again "
                    f"+{row[again] or float('nan'):.1f}s ({row['recovery_path']}), "
                    f"{row['status']}",
                    flush=True,
                )
        if args.healthy_s > 0:
            health = await healthy(rig, cfg, args)
    finally:
        await asyncio.to_thread(cluster.down, cfg)
    machine["load_after"] = load()
    summary = summarise(rows, health)
    print(table(summary, health))
    print(
        f"{args.trials} trials each, slow factor {args.factor:g}; {machine['cpus']} CPUs, load "
        f"average {machine['load_before']} before, {machine['load_after']} after"
    )
    if args.record:
        record = {
            "command": " ".join(["bench/silent.py", *sys.argv[1:]]),
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine,
            "rows": rows,
            "healthy": health,
            "summary": summary,
        }
        Path(args.record).write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")
    return 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--trials", type=int, default=10, help="hang and slow trials each")
    p.add_argument("--factor", type=float, default=2.0, help="the straggler's slowdown")
    p.add_argument(
        "--healthy-s", type=float, default=1800, help="the healthy run's length (0: none)"
    )
    p.add_argument("--eval-s", type=float, default=40, help="the healthy run's evaluation")
    p.add_argument("--stall-s", type=float, default=20, help="its data-loader stall")
    p.add_argument("--boot-delay", type=float, default=0)
    p.add_argument("--port-base", type=int, default=17600)
    p.add_argument("--state-dir", default=None)
    p.add_argument("--record", default=None, help="JSON file for the per-trial figures")
    args = p.parse_args()
    if args.trials < 1:
        p.error("--trials must be 1 or more")
    job_faults.parse_factor(args.factor)
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
