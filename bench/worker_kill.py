"""What a worker crash costs an incident at drain and at requeue.

On a sandbox of its own (started here, stopped by PID at the end), runs incidents of a
fault on a node of a running job (the machine's GPU really broken until a reboot): some
undisturbed, and some with the worker SIGKILLed (and started again) the moment the
incident's current step becomes `drain`, or `requeue`. Prints, per step, the median
seconds of the step itself and of the incident's time to quarantined (fault -> requeue
done, the job released to healthy nodes), without and with the kill, and the difference:
the delay the crash adds. Exits 1 when that difference exceeds --max-added (15 s).

    .venv/bin/python bench/worker_kill.py --repeats 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoclusters.core import hostlist  # noqa: E402
from autoclusters.core.policy import Rung  # noqa: E402
from autoclusters.core.settings import load_file, policy_for  # noqa: E402
from autoclusters.integrations.slurm import SlurmCli  # noqa: E402
from autoclusters.sandbox import cluster  # noqa: E402
from autoclusters.sandbox.drivers.chaos import ChaosReport, run_chaos  # noqa: E402
from autoclusters.sandbox.drivers.demo import wait_for  # noqa: E402
from autoclusters.sandbox.runtime.config import SandboxConfig  # noqa: E402

STEPS = ("drain", "requeue")
# 2 nodes, --requeue
PROGRESS_JOB = Path(cluster.__file__).parent / "machines" / "jobs" / "progress.sh"


def submit_job(cfg: SandboxConfig) -> int:
    out = subprocess.run(
        ["sbatch", "--parsable", f"--output={cfg.state_dir}/jobs/kill-%j.log", str(PROGRESS_JOB)],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.strip().split(";")[0])


def step_s(report: ChaosReport, step: str) -> float:
    """The step's time, every attempt of it included (a crash's wait is in its record)."""
    return sum(
        (s.finished_at - s.started_at).total_seconds()
        for s in report.steps
        if s.name == step and s.finished_at
    )


def quarantined_s(report: ChaosReport) -> float:
    """Fault (the incident opened) -> requeue done."""
    done = [s.finished_at for s in report.steps if s.name == "requeue" and s.finished_at]
    assert done and done[-1] is not None and report.opened_at is not None, report
    return (done[-1] - report.opened_at).total_seconds()


async def one_incident(cfg: SandboxConfig, kill_at: str | None, wipe: bool) -> ChaosReport:
    slurm = SlurmCli(cfg.slurm_conf)
    job_id = await asyncio.to_thread(submit_job, cfg)

    async def running() -> str | None:
        j = next((j for j in await slurm.jobs() if j.job_id == job_id), None)
        return j.nodes if j and j.job_state == "RUNNING" else None

    try:
        nodes = await wait_for("the job running", running, 60)
        node = hostlist.expand(nodes)[0]
        report = await run_chaos(
            cfg, "XID_79", node=node, broken_until=Rung.REBOOT,
            kill="worker" if kill_at else None, at=kill_at,
            wipe_worker_disk_on_restart=wipe, timeout_s=300,
        )  # fmt: skip
    finally:
        await slurm.cancel(job_id)

        async def gone() -> bool:
            j = next((j for j in await slurm.jobs() if j.job_id == job_id), None)
            return j is None or j.job_state in ("CANCELLED", "COMPLETED", "FAILED")

        await wait_for(f"job {job_id} cancelled", gone, 60, 0.2)
    if report.status != "resolved" or (kill_at and not report.actions[0].startswith("killed")):
        raise RuntimeError(f"incident did not go as planned: {report.model_dump_json()}")
    return report


async def run(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir or tempfile.mkdtemp(prefix="worker-kill-"))
    cfg = SandboxConfig(
        state_dir=state_dir, cluster="killbench", nodes=args.nodes, port_base=args.port_base,
        boot_delay_s=args.boot_delay, k8s=args.k8s, breaker_threshold=1000,
    )  # fmt: skip
    mode = "Slurm on Kubernetes" if args.k8s else "plain Slurm"
    print(f"sandbox in {state_dir} ({args.nodes} nodes, {mode}, boot delay {args.boot_delay:g} s)")
    await asyncio.to_thread(cluster.up, cfg)
    try:
        return await _bench(cfg, args)
    finally:
        await asyncio.to_thread(cluster.down, cfg)


async def _bench(cfg: SandboxConfig, args: argparse.Namespace) -> int:
    # Each incident is a fresh fault: no recurrence escalation between them.
    policy = policy_for(load_file(cfg.settings_file))
    policy = policy.model_copy(update={"recurrence_window_s": 0.001})
    cfg.policy_file.write_text(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False))
    runs: dict[str | None, list[ChaosReport]] = {None: [], **{s: [] for s in STEPS}}
    started = time.monotonic()
    for i in range(args.repeats):
        for kill_at in (None, *STEPS):
            report = await one_incident(cfg, kill_at, args.wipe_worker_disk)
            runs[kill_at].append(report)
            what = f"SIGKILL at {kill_at}" if kill_at else "no kill"
            print(
                f"  run {i + 1} {what:<18} {report.incident_id}: "
                + " ".join(f"{s} {step_s(report, s):.2f}s" for s in STEPS)
                + f", quarantined after {quarantined_s(report):.2f}s"
                + (f" (retried: {', '.join(report.retried)})" if report.retried else "")
            )
    print(f"({sum(len(r) for r in runs.values())} incidents in {time.monotonic() - started:.0f}s)")
    print()
    print(f"{'median seconds':<30}{'no kill':>9}{'SIGKILL':>9}{'added':>9}")
    worst = 0.0
    for step in STEPS:
        base, hit = runs[None], runs[step]
        for label, measure in (
            (f"{step}: the step", lambda r, s=step: step_s(r, s)),
            (f"{step}: fault -> quarantined", quarantined_s),
        ):
            without = statistics.median(measure(r) for r in base)
            with_kill = statistics.median(measure(r) for r in hit)
            added = with_kill - without
            worst = max(worst, added)
            print(f"{label:<30}{without:>9.2f}{with_kill:>9.2f}{added:>9.2f}")
    ok = worst <= args.max_added
    print()
    print(
        f"delay a worker SIGKILL adds at drain / requeue: at most {worst:.2f}s "
        f"({'within' if ok else 'OVER'} the {args.max_added:g}s budget)"
    )
    return 0 if ok else 1


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--repeats", type=int, default=2, help="incidents per case")
    p.add_argument("--boot-delay", type=float, default=2)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--k8s", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--wipe-worker-disk", action="store_true")
    p.add_argument("--max-added", type=float, default=15.0, help="seconds (exit 1 above)")
    p.add_argument("--port-base", type=int, default=17460)
    p.add_argument("--state-dir", default=None)
    args = p.parse_args()
    rc = asyncio.run(run(args))
    sys.stdout.flush()
    os._exit(rc)  # Temporal's threads can crash a finishing interpreter (sdk-python#300)


if __name__ == "__main__":
    main()
