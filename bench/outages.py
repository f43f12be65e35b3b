"""The outage matrix with long outages: every dependency of the runbook taken away for
--outage-s (60 s) at each step that uses it (sandbox/drivers/outage_matrix.py), on a sandbox of its
own (started here, stopped by PID at the end). Prints one row per case: where the outage
landed, how the incident ended, the repairs and the Crusoe emulator's operations, the job's
requeues, the longest outage the incident's timeline shows, the case's duration and what
went wrong (`outage_matrix.problems`). Exits 1 when any case has a problem.

    .venv/bin/python bench/outages.py [--outage-s 60] [--cases slurmctld,crusoe@repair]
    .venv/bin/python bench/outages.py --write-docs   # the table into docs/operations.md
    .venv/bin/python bench/outages.py --crash [--cases requeue,after:requeue] [--write-docs]

The whole matrix (18 cases) takes about 25 minutes at 60 s. `--crash` runs the crash cases
instead (slurmctld SIGKILLed after each of the runbook's Slurm writes, once the requeue step
has completed, and as the repair starts: `outage_matrix.crash_matrix`), each with what the
restarted controller forgot; their table has markers of its own in docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autoclusters.sandbox import cluster  # noqa: E402
from autoclusters.sandbox.drivers.outage import OutageReport, ops_cut_short  # noqa: E402
from autoclusters.sandbox.drivers.outage_matrix import (  # noqa: E402
    CrashCase,
    OutageCase,
    crash_matrix,
    describe,
    every_case_a_first_incident,
    matrix,
    problems,
    run_matrix_case,
    waves,
)
from autoclusters.sandbox.runtime.config import SandboxConfig  # noqa: E402
from tests.conftest import free_port_base  # noqa: E402

DOCS = ROOT / "docs" / "operations.md"
BEGIN, END = "<!-- outage-matrix:begin -->", "<!-- outage-matrix:end -->"
HEADER = (
    "| component | step | landed at | status | repairs | cloud ops | requeues "
    "| max outage shown | duration | problems |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)
CRASH_BEGIN, CRASH_END = "<!-- controller-crash:begin -->", "<!-- controller-crash:end -->"
CRASH_HEADER = (
    "| crash at | landed at | SIGKILL after the write | the restarted controller forgot "
    "| status | repairs | cloud ops | requeues | vanished | node after | duration | problems |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def crash_row(case: CrashCase, r: OutageReport | BaseException, took_s: float) -> str:
    if isinstance(r, BaseException):
        cells = ["-", "-", "-", "error", *["-"] * 5, f"{took_s:.0f} s", f"{type(r).__name__}: {r}"]
    else:
        c = r.crash
        landed = f"{r.landed_down} → {r.landed_up}" if r.outage else "never reached"
        lag = f"{c.lag_s:.2f} s" if c is not None and c.lag_s is not None else "-"
        forgot = "; ".join(c.forgot) if c is not None and c.forgot else "nothing"
        cells = [
            landed, lag, forgot, r.status, ", ".join(r.repairs) or "-",
            str(len(r.cloud_ops) - len(ops_cut_short(r))), str(r.job_restart_cnt),
            ", ".join(map(str, r.vanished_jobs)) or "-", r.node_state or "-",
            f"{took_s:.0f} s", "; ".join(problems(case, r)) or "ok",
        ]  # fmt: skip
    cells = [case.moment, *cells]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def row(case: OutageCase, r: OutageReport | BaseException, took_s: float) -> str:
    if isinstance(r, BaseException):
        cells = ["-", "error", "-", "-", "-", "-", f"{took_s:.0f} s", f"{type(r).__name__}: {r}"]
    else:
        landed = f"{r.landed_down} → {r.landed_up}" if r.outage else "never reached"
        cut = ops_cut_short(r)
        ops = str(len(r.cloud_ops) - len(cut)) + (f" (+{len(cut)} cut short)" if cut else "")
        shown = f"{r.max_outage_shown_s:g} s" if r.max_outage_shown_s is not None else "-"
        cells = [
            landed, r.status, ", ".join(r.repairs) or "-", ops, str(r.job_restart_cnt),
            shown, f"{took_s:.0f} s", "; ".join(problems(case, r)) or "ok",
        ]  # fmt: skip
    cells = [case.component, case.at, *cells]
    return "| " + " | ".join(c.replace("|", "/") for c in cells) + " |"


def write_docs(
    table: str, outage_s: float, argv: list[str], begin: str = BEGIN, end: str = END
) -> None:
    """Replace what lies between the markers in docs/operations.md."""
    text = DOCS.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{DOCS}: no {begin} ... {end} section to replace")
    command = " ".join(["bench/outages.py", *argv])
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    body = (
        f"{begin}\n{table}\n\n{outage_s:g} s outages; `.venv/bin/python {command}`, {when}.\n{end}"
    )
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    DOCS.write_text(pattern.sub(lambda _: body, text, count=1))
    print(f"wrote the table into {DOCS}")


async def run(args: argparse.Namespace) -> int:
    only = [c for c in args.cases.split(",") if c] if args.cases else None
    cases: list[OutageCase] = list(crash_matrix(only)) if args.crash else matrix(only)
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="outages-"))
    cfg = SandboxConfig(
        state_dir=state_dir, cluster="outagebench", nodes=args.nodes,
        port_base=args.port_base or free_port_base(), boot_delay_s=args.boot_delay, k8s=True,
        breaker_threshold=1000,
    )  # fmt: skip
    print(f"sandbox in {state_dir}: {len(cases)} cases, {args.outage_s:g} s outages")
    await asyncio.to_thread(cluster.up, cfg)
    try:
        every_case_a_first_incident(cfg)
        rows, bad, started = [], 0, time.monotonic()
        turn = 0
        for wave in waves(cases):
            nodes = [cfg.node_names()[(turn + i) % args.nodes] for i in range(len(wave))]
            turn += len(wave)
            t0 = time.monotonic()
            runs = [
                run_matrix_case(cfg, c, n, args.outage_s) for c, n in zip(wave, nodes, strict=True)
            ]
            results = await asyncio.gather(*runs, return_exceptions=True)
            took = time.monotonic() - t0
            for case, result in zip(wave, results, strict=True):
                if isinstance(result, BaseException):
                    print(f"{case.id}: {type(result).__name__}: {result}")
                    bad += 1
                else:
                    print(describe(case, result))
                    bad += bool(problems(case, result))
                if isinstance(case, CrashCase):
                    rows.append(crash_row(case, result, took))
                else:
                    rows.append(row(case, result, took))
        table = (CRASH_HEADER if args.crash else HEADER) + "\n" + "\n".join(rows)
        print(f"\n{table}\n\n{len(cases)} cases in {time.monotonic() - started:.0f} s, {bad} bad")
        if args.write_docs and args.crash:
            write_docs(table, args.outage_s, sys.argv[1:], CRASH_BEGIN, CRASH_END)
        elif args.write_docs:
            write_docs(table, args.outage_s, sys.argv[1:])
        return 1 if bad else 0
    finally:
        await asyncio.to_thread(cluster.down, cfg)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--outage-s", type=float, default=60, help="seconds each component is away")
    p.add_argument(
        "--cases", default="", help="comma-separated: ids (slurmctld@drain), components "
        "(crusoe) or steps (@repair); default: all",
    )  # fmt: skip
    p.add_argument("--write-docs", action="store_true", help="the table into docs/operations.md")
    p.add_argument(
        "--crash", action="store_true", help="the crash cases (slurmctld SIGKILLed) instead; "
        "--cases then names moments (requeue, after:requeue)",
    )  # fmt: skip
    sandbox_arguments(p)
    finish(asyncio.run(run(p.parse_args())))


def sandbox_arguments(p: argparse.ArgumentParser) -> None:
    """The sandbox a matrix bench starts (also bench/temporal_restart.py's)."""
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--boot-delay", type=float, default=2)
    p.add_argument("--port-base", type=int, default=0, help="default: a free range")
    p.add_argument("--state-dir", default=None, help="default: a new directory under /tmp")


def finish(rc: int) -> None:
    sys.stdout.flush()
    os._exit(rc)  # Temporal's threads can crash a finishing interpreter (sdk-python#300)


if __name__ == "__main__":
    main()
