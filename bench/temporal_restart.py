"""What a Temporal restart adds to an incident, beyond the restart itself (issue 41).

On one sandbox (Kubernetes mode, 4 nodes, as bench/outages.py), the outage matrix's
Temporal cases over and over: the dev server stopped (SIGTERM, or SIGKILL with `--kill`)
while the incident is in a step, kept away `--outage-s` (12 s, the matrix's), started again
on its own database. Per case, the *restart lag* (sandbox/drivers/restart_lag.py): from the
moment the step could have completed (the server back, and what the step waited for done:
the node's job ended, or the reboot finished) to the step's completion as the run's history
records it. That is the delay the restart adds: a task lost with the server waits out a
timeout (heartbeat 10 s, workflow task 10 s), a worker's poll its backoff.

    .venv/bin/python bench/temporal_restart.py --rounds 10 --record /tmp/restart.json

Each round runs `temporal@wait_idle` (a `--no-requeue` job holds the node through the
outage and ends 5 s after it) and `temporal@repair` (the server away while the reboot
runs). A tail is the p95 over 20 cases or more, else the largest ("max of n"). Exits 1 when
a case had a problem (`outage_matrix.problems`) or its lag is unknown.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # mttr

from mttr import load, stats, tail_name  # noqa: E402
from outages import finish, sandbox_arguments  # noqa: E402

from autoclusters.sandbox import cluster  # noqa: E402
from autoclusters.sandbox.drivers.outage import OutageReport  # noqa: E402
from autoclusters.sandbox.drivers.outage_matrix import (  # noqa: E402
    OutageCase,
    every_case_a_first_incident,
    problems,
    run_matrix_case,
)
from autoclusters.sandbox.drivers.restart_lag import ready_at, restart_lag_s, spanned  # noqa: E402
from autoclusters.sandbox.runtime.config import SandboxConfig  # noqa: E402
from tests.conftest import free_port_base  # noqa: E402

CASES = (OutageCase("temporal", "wait_idle"), OutageCase("temporal", "repair"))


def figures(case: OutageCase, r: OutageReport, took_s: float) -> dict[str, Any]:
    ready = ready_at(r)
    return {
        "case": case.id,
        "node": r.node,
        "incident": r.incident_id,
        "landed": f"{r.landed_down} -> {r.landed_up}",
        "hit_step": r.hit_step,
        "down_s": r.outage.down_s if r.outage else None,
        "up_at": r.outage.up_at.isoformat() if r.outage else None,
        "ready_at": ready.isoformat() if ready else None,
        "step_completed_at": r.step_completed_at.isoformat() if r.step_completed_at else None,
        "lag_s": restart_lag_s(r),
        "spanned": spanned(r),
        "status": r.status,
        "problems": problems(case, r),
        "took_s": round(took_s, 1),
    }


async def run(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="temporal-restart-"))
    cfg = SandboxConfig(
        state_dir=state_dir, cluster="restartbench", nodes=args.nodes,
        port_base=args.port_base or free_port_base(), boot_delay_s=args.boot_delay, k8s=True,
        breaker_threshold=1000, inference=False,
    )  # fmt: skip
    record: dict[str, Any] = {
        "command": " ".join(["bench/temporal_restart.py", *sys.argv[1:]]),
        "started": datetime.now(UTC).isoformat(),
        "load_before": load(),
        "cpus": os.cpu_count(),
        "cases": [],
    }
    print(f"sandbox in {state_dir}: {args.rounds} rounds, {args.outage_s:g} s outages")
    await asyncio.to_thread(cluster.up, cfg)
    bad = 0
    try:
        every_case_a_first_incident(cfg)
        turn = 0
        for i in range(args.rounds):
            for case in CASES:
                node = cfg.node_names()[turn % args.nodes]
                turn += 1
                t0 = time.monotonic()
                try:
                    r = await run_matrix_case(cfg, case, node, args.outage_s, kill=args.kill)
                except Exception as e:  # one case's failure is a figure too
                    bad += 1
                    print(f"round {i + 1} {case.id} on {node}: {type(e).__name__}: {e}")
                    record["cases"].append({"case": case.id, "error": f"{type(e).__name__}: {e}"})
                    continue
                row = figures(case, r, time.monotonic() - t0)
                record["cases"].append(row)
                lag = row["lag_s"]
                bad += bool(row["problems"]) or (lag is None and row["spanned"])
                shown = f"{lag:6.2f} s" if lag is not None else "unknown"
                if lag is None and not row["spanned"]:
                    shown = "none: the outage missed the step"
                print(
                    f"round {i + 1} {case.id:<18} {node}: lag {shown}  landed {row['landed']}  "
                    f"{row['status']} in {row['took_s']:.0f} s  "
                    f"{'; '.join(row['problems']) or 'ok'}  load {load()[0]}"
                )
                if args.record:
                    Path(args.record).write_text(json.dumps(record, indent=1))
    finally:
        await asyncio.to_thread(cluster.down, cfg)
    record["load_after"] = load()
    record["ended"] = datetime.now(UTC).isoformat()
    measured = [x for x in record["cases"] if x.get("lag_s") is not None]
    lags = {c.id: [x["lag_s"] for x in measured if x["case"] == c.id] for c in CASES}
    every = [v for vs in lags.values() for v in vs]
    record["summary"] = {k: stats(v) for k, v in {**lags, "all": every}.items() if v}
    before, after = record["load_before"], record["load_after"]
    print(f"\nrestart lag (s), {args.outage_s:g} s outages, load {before} -> {after}")
    print(f"{'case':<22}{'median':>9}{'tail':>9}{'n':>4}")
    for name, s in record["summary"].items():
        print(f"{name:<22}{s['median']:>9.2f}{s['p95']:>9.2f}{s['n']:>4}  {tail_name(s['n'])}")
    if args.record:
        Path(args.record).write_text(json.dumps(record, indent=1))
    return 1 if bad else 0


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=10, help="each round: wait_idle, then repair")
    p.add_argument("--outage-s", type=float, default=12, help="seconds Temporal is away")
    p.add_argument("--kill", action="store_true", help="SIGKILL the server, not SIGTERM")
    p.add_argument("--record", default=None, help="the per-case figures as JSON")
    sandbox_arguments(p)
    finish(asyncio.run(run(p.parse_args())))


if __name__ == "__main__":
    main()
