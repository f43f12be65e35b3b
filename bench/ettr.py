"""Effective training time ratio (ETTR): a training job of examples/training in the sandbox for
`--minutes` with a hardware fault every `--every-s`, each remediated by the real runbook.

    .venv/bin/python bench/ettr.py --minutes 30 --every-s 120 --baseline
    .venv/bin/python bench/ettr.py --minutes 10 --every-s 120 --baseline --record /tmp/ettr.json

The faults go round-robin over `--faults` (kind:effect, sandbox/machines/fault_effects.py; default
XID_79:hang, ECC_DBE:crash, IB_LINK_DOWN:lost), each on a node the job is stepping on at the
time (the batch host included), chosen at random (`--seed`). The node's agent detects it and
the runbook drains the node, recovers the job (in-job: the standby takes the seat; or a
requeue, from the newest checkpoint) and repairs and returns the node.

ETTR = the time spent on steps that were kept ÷ the wall time, from the job's first step to
the end of the window. A step is kept when it is in the job's final line of progress: a step
done again after a restart from a checkpoint counts once, in its last run, and the steps of a
run that a restart threw away count for nothing. A kept step's time is the gap to the step
before it in the same run (the first step of a run or a re-formed group: the job's median
step time), so recovery gaps and restarts are not counted as training. `--baseline` runs the
same job again, in a fresh sandbox, with no faults: its ETTR is what the job's own
checkpoints and logging cost, the ceiling for the run with faults. The machine's load
average is sampled at each fault tick and printed.

`--job-recovery in-job` (default): examples/training's in-job mode, 2 nodes training and a
standby (`SPARES=1`, 3 of the sandbox's 4 nodes); the first fault is recovered in the job,
the next one (no standby left) by a requeue that brings back a standby, and so on.
`--job-recovery requeue`: the 2-node torchrun job, requeued at each fault.

`--layout holders` (with in-job): standbys held outside the job (core/holders.py,
docs/recovery.md): 5 nodes; a holder job on the last one (the fleet's pool, the policy's
`standby_holders: 1`); the job on the other 4, its batch host a launcher that never trains
(`LAUNCHER=1`), 2 nodes training and its own standby. Once that standby is used the runbook
gives the job the free holder, into which its launcher starts a new standby; each node
returned to service gets a new holder, so every fault off the batch host is recovered in
place. The batch host runs no rank, so no fault lands there (faults go to nodes stepping).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # mttr

import mttr  # noqa: E402
import yaml  # noqa: E402

from autoclusters.core import hostlist  # noqa: E402
from autoclusters.core.models import IncidentState  # noqa: E402
from autoclusters.sandbox import cluster  # noqa: E402
from autoclusters.sandbox.machines import fault_effects, training_job
from autoclusters.sandbox.machines.joblog import ProgressLine, progress_lines  # noqa: E402

DEFAULT_FAULTS = "XID_79:hang,ECC_DBE:crash,IB_LINK_DOWN:lost"
STEPPING_S = 5.0  # a node is training when it logged a step this recently


def parse_faults(spec: str) -> list[tuple[str, fault_effects.Effect]]:
    """`KIND[:EFFECT],...`: an effect left out is the kind's realistic one."""
    out = []
    for item in spec.split(","):
        kind, _, effect = item.strip().partition(":")
        out.append((kind, fault_effects.parse_effect(effect or None, kind)))
    return out


Gen = tuple[int, int]  # a run of the job (Slurm's restart count) and its group (in-job)


def generations(lines: list[ProgressLine]) -> dict[Gen, dict[int, float]]:
    """Each run/group's steps and when the first rank logged each."""
    gens: dict[Gen, dict[int, float]] = {}
    for ln in lines:
        steps = gens.setdefault((ln.restart, ln.elastic), {})
        steps[ln.step] = min(ln.ts, steps.get(ln.step, ln.ts))
    return gens


def step_period(gens: dict[Gen, dict[int, float]]) -> float:
    """The job's median step time: gaps between consecutive steps of one run/group."""
    gaps = [steps[s] - steps[s - 1] for steps in gens.values() for s in steps if s - 1 in steps]
    return statistics.median(gaps) if gaps else 0.0


def kept_time(lines: list[ProgressLine]) -> tuple[float, int, int, float]:
    """Seconds spent on the steps that were kept, how many were kept, how many were done in
    all (every run's), and the step period. Kept: walking back from the last run, each run
    keeps its steps below the first step the next kept run did (that run went on from a
    checkpoint or its memory); what a later run did again is lost."""
    gens = generations(lines)
    period = step_period(gens)
    order = sorted(gens, key=lambda g: min(gens[g].values()))
    total, kept, upto = 0.0, 0, float("inf")
    for g in reversed(order):
        steps = gens[g]
        mine = sorted(s for s in steps if s <= upto)
        for s in mine:
            prev = steps.get(s - 1)
            total += steps[s] - prev if prev is not None else period
        kept += len(mine)
        if mine:
            upto = mine[0] - 1
    done = sum(len(steps) for steps in gens.values())
    return total, kept, done, period


def stepping_nodes(log: Path, now: float) -> list[str]:
    """The nodes of the job's newest run/group that logged a step in the last few seconds."""
    lines = progress_lines(log)
    if not lines:
        return []
    newest = max(lines, key=lambda ln: ln.ts)
    gen = (newest.restart, newest.elastic)
    return sorted(
        {
            ln.node
            for ln in lines
            if (ln.restart, ln.elastic) == gen and ln.ts >= now - STEPPING_S and ln.node
        }
    )


def stepping_again(lines: list[ProgressLine], fault_at: float) -> float | None:
    """Seconds from the fault to the first step of a run or group that began after it."""
    gens = generations(lines)
    firsts = [min(steps.values()) for steps in gens.values()]
    later = [ts for ts in firsts if ts > fault_at]
    return min(later) - fault_at if later else None


async def one_run(args: argparse.Namespace, with_faults: bool) -> dict[str, Any]:
    faults = parse_faults(args.faults) if with_faults else []
    window = args.minutes * 60
    # A fault every `every_s` from the first step, the last one before the window's end.
    ticks = math.ceil(window / args.every_s) - 1 if faults else 0
    in_job = args.job_recovery == "in-job"
    held = in_job and args.layout == "holders"
    cfg = mttr.sandbox_config(args, ticks, "ettr-", nodes=max(args.nodes, 5) if held else None)
    load_samples = [mttr.load()]
    await asyncio.to_thread(cluster.up, cfg)
    try:
        rig = await mttr.Rig.connect(cfg)  # (writes the policy file)
        if held:
            keep_holders(cfg.policy_file, 1)
            rig.policy = rig.policy.model_copy(update={"standby_holders": 1})
        submitted = time.time()
        if held:  # the fleet's pool: one holder, on the last node
            holder = await rig.slurm.submit_holder(cfg.node_names()[-1])
            print(f"holder job {holder} on {cfg.node_names()[-1]}")
        job_id, log, kind = await training_job.submit(
            rig.slurm, cfg, "ettr", in_job=in_job, holders=held
        )
        print(f"job {job_id} ({kind}), log {log}")
        start = await mttr.job_stepping(rig.slurm, job_id, log, 0)
        end = start + window
        rng = random.Random(args.seed)
        injected: list[dict[str, Any]] = []
        outcomes: list[asyncio.Task[IncidentState]] = []
        for i in range(ticks):
            tick = start + (i + 1) * args.every_s
            await asyncio.sleep(max(0.0, tick - time.time()))
            load_samples.append(mttr.load())
            nodes = stepping_nodes(log, time.time())
            waited = time.time()
            while not nodes and time.time() < end:  # still recovering from the last fault
                await asyncio.sleep(0.5)
                nodes = stepping_nodes(log, time.time())
            if not nodes:
                break
            job = await mttr.job_running(rig.slurm, job_id, 0)
            fault, effect = faults[i % len(faults)]
            node = rng.choice(nodes)
            fault_at, opened = await rig.fault(node, fault, effect, job_id)
            outcomes.append(asyncio.create_task(rig.outcome(opened)))
            injected.append(
                {
                    "at_s": round(fault_at - start, 1),
                    "late_s": round(fault_at - waited, 1),
                    "node": node,
                    "batch host": node == job.batch_host,
                    "fault": fault,
                    "effect": effect,
                    "job nodes": hostlist.expand(job.nodes),
                    "incident": opened.incident_id,
                    "fault_at": fault_at,
                }
            )
            print(
                f"fault {i + 1}/{ticks} at +{fault_at - start:.0f}s: {fault} ({effect}) on {node}"
                f"{' (batch host)' if node == job.batch_host else ''}, {opened.incident_id}"
            )
        await asyncio.sleep(max(0.0, end - time.time()))
        load_samples.append(mttr.load())
        lines = [ln for ln in progress_lines(log) if start <= ln.ts <= end]
        await rig.slurm.cancel(job_id)
        for rec, task in zip(injected, outcomes, strict=True):
            try:
                state = await asyncio.wait_for(task, 180)
            except (TimeoutError, Exception) as e:  # noqa: BLE001 - reported, not raised
                rec["status"] = f"not closed: {type(e).__name__}"
                continue
            rec["status"] = state.status
            rec["recovery path"] = state.recovery_path.get(job_id)
            # The fault's detection (the agent's check and debounce), apart from the recovery.
            rec["detected_s"] = round(state.request.opened_at.timestamp() - rec.pop("fault_at"), 2)
    finally:
        await asyncio.to_thread(cluster.down, cfg)
    for rec in injected:
        rec.pop("fault_at", None)  # (an incident that did not close)
        again = stepping_again(lines, start + rec["at_s"])
        rec["job stepping again_s"] = round(again, 2) if again is not None else None
    spent, kept, done, period = kept_time(lines)
    return {
        "faults": bool(faults),
        "job": kind,
        "job recovery": args.job_recovery,
        "layout": args.layout if in_job else None,
        "startup_s": round(start - submitted, 1),
        "wall_s": round(window, 1),
        "kept_s": round(spent, 1),
        "steps kept": kept,
        "steps done": done,
        "step_s": round(period, 3),
        "ettr": spent / window,
        "injected": injected,
        "load": load_samples,
    }


def keep_holders(policy_file: Path, n: int) -> None:
    """The sandbox's policy with `standby_holders: n` (read at every incident's opening)."""
    policy = yaml.safe_load(policy_file.read_text())
    policy["standby_holders"] = n
    policy_file.write_text(yaml.safe_dump(policy, sort_keys=False))


def report(run: dict[str, Any]) -> None:
    name = "with faults" if run["faults"] else "no faults (baseline)"
    if run.get("layout"):
        name += f", layout {run['layout']}"
    loads = [sample[0] for sample in run["load"]]
    print(
        f"\n{name}: ETTR {run['ettr']:.3f} ({run['kept_s']:.0f} s on kept steps of "
        f"{run['wall_s']:.0f} s; {run['steps kept']} steps kept of {run['steps done']} done, "
        f"{run['step_s']:.2f} s a step; job {run['job']}, first step {run['startup_s']:.0f} s "
        f"after submission); load average (1 min) {min(loads):.2f}-{max(loads):.2f} over "
        f"{len(loads)} samples"
    )
    for rec in run["injected"]:
        again = rec.get("job stepping again_s")
        again_s = f"+{again:.1f}s" if again is not None else "never"
        print(
            f"  +{rec['at_s']:>5.0f}s {rec['fault']:<13}{rec['effect']:<6}{rec['node']:<8}"
            f"{'batch host ' if rec['batch host'] else '           '}"
            f"{rec.get('recovery path') or '-':<9}{rec.get('status', '?'):<10} "
            f"stepping again {again_s}"
            + (f" (detected +{rec['detected_s']:.1f}s)" if "detected_s" in rec else "")
        )
    agains = [a for r in run["injected"] if (a := r.get("job stepping again_s")) is not None]
    if agains:
        s = mttr.stats(agains)
        print(
            f"  job stepping again after a fault: median {s['median']:.1f} s, "
            f"{mttr.tail_name(s['n'])} {s['p95']:.1f} s"
        )


async def run(args: argparse.Namespace) -> int:
    runs = []
    if not args.baseline_only:
        runs.append(await one_run(args, with_faults=True))
        report(runs[-1])
    if args.baseline or args.baseline_only:
        runs.append(await one_run(args, with_faults=False))
        report(runs[-1])
    if len(runs) == 2:
        print(f"\nETTR {runs[0]['ettr']:.3f} with faults, {runs[1]['ettr']:.3f} without")
    print(f"{os.cpu_count()} CPUs; load average now {mttr.load()}")
    if args.record:
        record = {
            "command": " ".join(["bench/ettr.py", *sys.argv[1:]]),
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "runs": runs,
        }
        Path(args.record).write_text(json.dumps(record, indent=1) + "\n")
        print(f"record: {args.record}")
    return 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--minutes", type=float, default=30)
    p.add_argument("--every-s", type=float, default=120, help="seconds between faults")
    p.add_argument("--faults", default=DEFAULT_FAULTS, help="KIND[:EFFECT],... round-robin")
    p.add_argument("--job-recovery", choices=["in-job", "requeue"], default="in-job")
    p.add_argument(
        "--layout",
        choices=["in-job", "holders"],
        default="in-job",
        help="in-job: the standby inside the job; holders: a launcher that never trains, "
        "and standbys held outside the job by holder jobs (5 nodes at least)",
    )
    p.add_argument("--baseline", action="store_true", help="also the same run with no faults")
    p.add_argument("--baseline-only", action="store_true", help="only the run with no faults")
    p.add_argument("--seed", type=int, default=39)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--boot-delay", type=float, default=0)
    p.add_argument("--port-base", type=int, default=17500)
    p.add_argument("--state-dir", default=None)
    p.add_argument("--record", default=None, help="JSON file for the runs' figures")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, mttr.interrupt)  # the sandbox still goes down
    rc = asyncio.run(run(args))
    sys.stdout.flush()
    os._exit(rc)  # Temporal's threads can crash a finishing interpreter (sdk-python#300)


if __name__ == "__main__":
    main()
