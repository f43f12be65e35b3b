"""The outage matrix: which (component, step) pairs are worth a case, the job each case
runs on its node, one case end to end (sandbox/drivers/outage.py's `run_outage_case` between the
job's start and its cleanup), and what a case must show. tests/on_sandbox/test_outage_matrix.py runs
it with 12 s outages, bench/outages.py with 60 s ones.

The crash cases (`crash_matrix`) are a different fault of slurmctld: SIGKILLed (no clean
state save) within a second after each Slurm write the runbook makes (its drain, its
requeue, its resume), once the requeue step has completed, and as the repair starts, then
started again on its StateSaveLocation (sandbox/drivers/controller_crash.py), so that it comes back
without what it had not saved yet.

Expected of every case: the incident resolves with one repair (a reboot: the GPU is broken
until then); the Crusoe emulator records one operation for it (besides one that the Crusoe
API's own outage cut short, which did nothing), none while the job still ran on the node; a
requeueable job is requeued exactly once, a held job runs to its end and the requeue step
saw it; the node is back in service in Slurm and uncordoned in Kubernetes; no job Slurm
places on the returned node started before its repair (a ghost: its processes went with
the machine); every job the incident requeued is still known to Slurm or named in the
incident's `vanished_jobs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from rich.console import Console

from autoclusters.integrations.slurm import SlurmCli, SlurmError
from autoclusters.sandbox.drivers.chaos import STEPS
from autoclusters.sandbox.drivers.controller_crash import AFTER, KIND_OF, STEP_OF, ControllerCrash
from autoclusters.sandbox.drivers.outage import (
    COMPONENTS,
    OutageError,
    OutageReport,
    _state,
    ops_cut_short,
    ops_under_job,
    run_outage_case,
    squeue_job,
)
from autoclusters.sandbox.drivers.restart_lag import restart_lag_s
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig

PROGRESS_JOB = Path(__file__).resolve().parents[1] / "machines" / "jobs" / "progress.sh"

# The matrix: at which steps each component's outage is worth a case, i.e. the steps that
# use it (an outage elsewhere proves nothing the kept cases do not).
USED_AT: dict[str, tuple[str, ...]] = {
    # Every Slurm step reads or writes through slurmctld; the repair talks to the cloud.
    "slurmctld": (
        "drain",
        "requeue",
        "wait_idle",
        "wait_registered",
        "health_gate",
        "return_to_service",
    ),  # fmt: skip
    # The repair's call, and the boot the emulator drives while the node registers again.
    "crusoe": ("repair", "wait_registered"),
    # The cordon right after wait_idle, the new machine's identity around the repair, the
    # uncordon before return_to_service.
    "k8s": ("wait_idle", "repair", "return_to_service"),
    # Notifications at the quarantine and at the repair: they must never block.
    "slack": ("drain", "repair"),
    # The server itself: the workflow and its activities wait for it.
    "temporal": ("wait_idle", "repair"),
    # The alert path only: the runbook must not depend on them, one case each is enough.
    "prometheus": ("wait_idle",),
    "alertmanager": ("wait_idle",),
    "api": ("wait_idle",),
}
# What a Temporal restart may add to the step it lands in, beyond its downtime
# (sandbox/drivers/restart_lag.py): every runbook activity heartbeats with a 10 s timeout
# and a workflow task times out after 10 s, so a task the restart lost is given again
# within that, plus the step's own poll (wait_idle 1 s, the cloud operation 2 s) and the
# worker's next poll. Generous, as a bound that guards against a stall must be under load:
# measured 2.7 s median, 6.3 s at most (bench/temporal_restart.py, docs/operations.md).
TEMPORAL_RESTART_LAG_BOUND_S = 20.0
# Steps reached before the repair: a `--no-requeue` job holds the node through the outage,
# so wait_idle must wait for it (and the repair never runs under it).
EARLY_STEPS = ("drain", "requeue", "wait_idle")
# How long past the outage's end that job ends by itself, so wait_idle waits for it through
# the whole outage and sees the job end only once the component is back (12 s away: the job
# ends ~17 s after the outage starts) ...
HOLD_PAST_OUTAGE_S = 5.0
# ... except where what follows is the point, so the job ends while the component is still
# away: the Kubernetes cordon follows wait_idle; Slack is only ever told when the incident
# opens and closes (and when it is held or escalates), so the drain's case runs on to the
# closing notification inside the outage.
# (seconds after the outage starts, whatever its length)
HOLD_SHORT: dict[tuple[str, str], float] = {("k8s", "wait_idle"): 5.0, ("slack", "drain"): 2.0}


@dataclass(frozen=True)
class OutageCase:
    component: str  # a short name (COMPONENTS)
    at: str  # the step (STEPS)

    @property
    def id(self) -> str:
        return f"{self.component}@{self.at}"

    @property
    def holds_node(self) -> bool:
        """A `--no-requeue` job on the node (early steps), else a requeueable job."""
        return self.at in EARLY_STEPS

    def hold_s(self, outage_s: float) -> float:
        """When the held job ends, in seconds after the outage starts."""
        return HOLD_SHORT.get((self.component, self.at), outage_s + HOLD_PAST_OUTAGE_S)


# The crash cases: slurmctld SIGKILLed at each of these moments of the incident
# (sandbox/drivers/controller_crash.py): right after its drain, its requeue and its resume are
# written (slurmctld's own log says when), once the requeue step has completed (the
# incident's `status` says when: the job's requeue, its hold released, may not be saved
# yet), and as the repair starts.
CRASH_MOMENTS = ("drain", "requeue", f"{AFTER}requeue", "resume", "repair")
# Before the incident opens, each case waits until slurmctld has nothing left to save, so
# that the drain starts a pass at once and what follows waits up to 5 s for the next: the
# requeue, written ~0.2 s after the drain, is then rolled back by a crash up to ~4 s later.
# For the drain itself a pass is started just before the opening (`poke_save`), so that the
# drain waits for the next one too.
CRASH_POKE = frozenset({"drain"})
# The resume comes ~10 s after the node's registration has been saved: by then slurmctld
# is quiet and would save it at once. From the health gate on, the case keeps it busy (a
# pass started every 2 s), so that the resume waits for a pass as on a busy controller.
CRASH_BUSY_FROM = {"resume": "health_gate"}
# The requeue step completes ~2 s after its requeue (it watches the job settle and releases
# its hold): by then a pass may have saved it. That case holds the job state's saves from the
# opening to the crash, so that the crash forgets the requeue however the passes fall (the
# drain, node state, is saved as usual).
CRASH_HOLD: dict[str, tuple[str, ...]] = {"after:requeue": ("job_state",)}
# What each crash case must have made the restarted controller forget, or it tests
# nothing: the start of one of its `forgot` lines.
MUST_FORGET = {
    "drain": "the drain of ",
    "requeue": "the requeue of job ",
    "after:requeue": "the requeue of job ",
    "resume": "the resume of ",
}


@dataclass(frozen=True)
class CrashCase(OutageCase):
    """slurmctld crashed at `moment` (CRASH_MOMENTS); `at` is the step it falls in."""

    moment: str = "requeue"

    @property
    def id(self) -> str:
        return f"slurmctld-crash@{self.moment}"

    @property
    def holds_node(self) -> bool:
        """Always a requeueable job: what a crash can roll back is its requeue."""
        return False


def crash_matrix(only: list[str] | None = None) -> list[CrashCase]:
    """Every crash case, in runbook order. `only`: moments (`requeue`, `after:requeue`)."""
    cases = [
        CrashCase("slurmctld", STEP_OF.get(m, m.removeprefix(AFTER)), m) for m in CRASH_MOMENTS
    ]
    if not only:
        return cases
    unknown = [m for m in only if m not in CRASH_MOMENTS]
    if unknown:
        raise OutageError(f"no crash case at {', '.join(unknown)}")
    return [c for c in cases if c.moment in only]


def skipped(component: str, step: str) -> bool:
    """A pair the matrix leaves out: the step does not use the component."""
    return step not in USED_AT.get(component, ())


def matrix(only: list[str] | None = None) -> list[OutageCase]:
    """Every kept case, components in COMPONENTS order, steps in runbook order. `only`:
    ids (`slurmctld@drain`), components (`crusoe`) or steps (`@repair`) to keep."""
    cases = [
        OutageCase(c, s) for c in COMPONENTS for s in STEPS if not skipped(c, s)
    ]  # fmt: skip
    if not only:
        return cases
    unknown = [f for f in only if not any(_matches(case, f) for case in cases)]
    if unknown:
        raise OutageError(f"no case matches {', '.join(unknown)}")
    return [case for case in cases if any(_matches(case, f) for f in only)]


# Components no step of any incident uses: their outages cannot reach another incident, so
# their cases may run side by side (on different nodes). Every other outage reaches any
# incident running at the time (slurmctld and Temporal every step; the cloud, Kubernetes,
# Slack and the API, through the agents' health snapshots, some step): alone.
REACHES_NOTHING = frozenset({"prometheus", "alertmanager"})


def waves(cases: list[OutageCase], width: int = 2) -> list[tuple[OutageCase, ...]]:
    """The cases in runs: side by side only those whose components reach nothing, at most
    `width` together (the sandbox's guard lets half of 4 nodes out at once)."""
    out: list[tuple[OutageCase, ...]] = []
    quiet: list[OutageCase] = []
    for case in cases:
        if case.component not in REACHES_NOTHING:
            out.append((case,))
            continue
        quiet.append(case)
        if len(quiet) == width:
            out.append(tuple(quiet))
            quiet = []
    if quiet:
        out.append(tuple(quiet))
    return out


def _matches(case: OutageCase, wanted: str) -> bool:
    component, _, step = wanted.partition("@")
    return (not component or component == case.component) and (not step or step == case.at)


# --- a case's job ------------------------------------------------------------------------------


def _sbatch(cfg: SandboxConfig, *argv: str) -> int:
    out = subprocess.run(
        [daemons.require("sbatch"), "--parsable", *argv],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return int(out.strip().split(";")[0])


def submit_held_job(cfg: SandboxConfig, node: str, stop_file: Path) -> int:
    """A `--no-requeue` job on exactly `node` that runs until `stop_file` exists (the
    harness creates it a while after the outage starts): a job the runbook cannot move."""
    return _sbatch(
        cfg, "--job-name=outage-held", "--nodes=1", f"--nodelist={node}", "--no-requeue",
        f"--output={cfg.state_dir}/jobs/outage-held-%j.log",
        f"--wrap=while [ ! -e {stop_file} ]; do sleep 0.2; done",
    )  # fmt: skip


def submit_requeueable_job(cfg: SandboxConfig, node: str) -> int:
    """The progress job (`--requeue`), on `node` only: requeued, it waits for that node,
    so parallel cases never meet on a node and its restart count is this incident's."""
    return _sbatch(
        cfg, "--nodes=1", f"--nodelist={node}",
        f"--output={cfg.state_dir}/jobs/outage-progress-%j.log", str(PROGRESS_JOB),
    )  # fmt: skip


def cancel_job(cfg: SandboxConfig, job_id: int) -> None:
    subprocess.run(
        [daemons.require("scancel"), str(job_id)],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True, check=False,
    )  # fmt: skip


async def restore_node(cfg: SandboxConfig, node: str) -> list[str]:
    """What a human does after an incident that left the node out (failed, or cancelled
    because it stalled), so the next case starts on a node in service: resume it in Slurm,
    uncordon it in Kubernetes and drop our taint. Says what it did."""
    from autoclusters.core.kubernetes import TAINT_KEY

    done: list[str] = []
    slurm = SlurmCli(cfg.slurm_conf)
    # Until it is in service: resume it whenever Slurm will take that (a node that
    # slurmctld has not heard from since its restart is UNKNOWN, and refuses a resume).
    deadline = time.monotonic() + 60
    while True:
        state = await slurm.node(node)
        if state is not None and state.responding and not state.drained:
            break
        if time.monotonic() > deadline:
            shown = state.display_state if state else "unknown to Slurm"
            done.append(f"{node} still not in service after 60s ({shown})")
            break
        if state is not None and (state.drained or state.state == "down"):
            with contextlib.suppress(SlurmError):
                await slurm.resume(node)
                done.append(f"resumed {node} ({state.display_state}: {state.reason})")
        await asyncio.sleep(1)
    if cfg.k8s:
        url = f"{cfg.k8s_url}/api/v1/nodes/{node}"
        auth = {"Authorization": f"Bearer {cfg.k8s_token()}"}
        async with httpx.AsyncClient(timeout=10, headers=auth, verify=cfg.k8s_tls()) as http:
            obj = (await http.get(url)).raise_for_status().json()
            spec = obj.get("spec") or {}
            taints = [t for t in spec.get("taints") or [] if t.get("key") != TAINT_KEY]
            if spec.get("unschedulable") or taints != (spec.get("taints") or []):
                patch = {"spec": {"unschedulable": False, "taints": taints}}
                headers = {"Content-Type": "application/merge-patch+json"}
                (await http.patch(url, json=patch, headers=headers)).raise_for_status()
                done.append(f"uncordoned {node} in Kubernetes")
    return done


def case_timeout_s(outage_s: float) -> float:
    """An undisturbed incident takes ~10 s here, a held job keeps it ~outage + 10 s more,
    the outage may cost its length again in retries: past this the incident is stuck."""
    return 90 + 2 * outage_s


async def running_on(cfg: SandboxConfig, job_id: int, node: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = await asyncio.to_thread(squeue_job, cfg, job_id)
        if job is not None and _state(job) == "RUNNING" and job.get("nodes") == node:
            return
        await asyncio.sleep(0.3)
    raise OutageError(f"job {job_id} not running on {node} after {timeout_s:.0f}s")


async def _gone(cfg: SandboxConfig, job_id: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = await asyncio.to_thread(squeue_job, cfg, job_id)
        if job is None or _state(job) in ("CANCELLED", "COMPLETED", "FAILED"):
            return
        await asyncio.sleep(0.3)
    raise OutageError(f"job {job_id} still there {timeout_s:.0f}s after scancel")


async def run_matrix_case(
    cfg: SandboxConfig,
    case: OutageCase,
    node: str,
    outage_s: float,
    *,
    kill: bool = False,
    console: Console | None = None,
) -> OutageReport:
    """The case's job on `node`, the incident with `case.component` away at `case.at` (a
    crash case: slurmctld crashed at `case.moment`), then the job cancelled and, when the
    incident left the node out, the node put back (so a failing case does not fail the next
    ones on that node; the report's notes say so).

    A cancel of a job that is pending (a crash case's job, requeued) is not saved by
    slurmctld until some later job change (sandbox/drivers/controller_crash.py): the next case's
    submission is one, before its crash."""
    release = cfg.state_dir / "jobs" / f"release-{case.id}-{uuid.uuid4().hex[:6]}"
    if case.holds_node:
        job_id = await asyncio.to_thread(submit_held_job, cfg, node, release)
    else:
        job_id = await asyncio.to_thread(submit_requeueable_job, cfg, node)
    report: OutageReport | None = None
    try:
        await running_on(cfg, job_id, node, 60)
        crash = None
        if isinstance(case, CrashCase):
            crash = ControllerCrash(
                cfg, case.moment, node, outage_s, jobs=[job_id],
                poke=case.moment in CRASH_POKE, busy_from=CRASH_BUSY_FROM.get(case.moment),
                hold=CRASH_HOLD.get(case.moment, ()),
            )  # fmt: skip
        report = await run_outage_case(
            cfg, case.component, case.at, outage_s, node, job_id=job_id,
            release=release if case.holds_node else None,
            release_after_s=case.hold_s(outage_s), kill=kill or crash is not None,
            timeout_s=case_timeout_s(outage_s), console=console, crash=crash,
        )  # fmt: skip
    finally:
        release.touch()
        await asyncio.to_thread(cancel_job, cfg, job_id)
        await _gone(cfg, job_id)
        if report is None or report.status != "resolved" or report.node_drained:
            try:
                restored = await restore_node(cfg, node)
            except Exception as e:  # the case's own outcome matters more than this
                restored = [f"could not restore {node}: {type(e).__name__}: {e}"]
            if report is not None:
                report.notes += restored
            elif console is not None:
                console.print(f"outage: {case.id}: {'; '.join(restored) or 'nothing to restore'}")
    return report


def problems(case: OutageCase, r: OutageReport) -> list[str]:
    """What the case shows that it must not (empty: the case passes)."""
    out = []
    if r.outage is None:
        out.append(f"{case.component} was never taken away")
    if r.status != "resolved":
        out.append(f"incident {r.status}, not resolved")
    if r.repairs != ["reboot"]:
        out.append(f"repairs {r.repairs}, not one reboot")
    cut = ops_cut_short(r)
    counted = [o for o in r.cloud_ops if o not in cut]
    if len(counted) != len(r.repairs) or any(o.state != "SUCCEEDED" for o in counted):
        ops = ", ".join(f"{o.action} {o.state}" for o in r.cloud_ops)
        out.append(f"cloud operations [{ops}] for {len(r.repairs)} repair(s)")
    under = ops_under_job(r)
    if under:
        out.append(f"cloud operation under the running job: {under[0].action} {under[0].state}")
    requeue = next((s for s in r.steps if s.name == "requeue"), None)
    if case.holds_node:
        if r.job_state != "COMPLETED" or r.job_restart_cnt != 0 or r.job_end_time is None:
            out.append(f"held job {r.job_state}, restarts {r.job_restart_cnt}: not run to its end")
        # It ran on the node all along: an outage must not read as "no jobs" or "idle".
        if requeue is not None and str(r.job_id) not in requeue.detail:
            out.append(f"requeue did not see the held job: {requeue.detail!r}")
        idle = next((s for s in r.steps if s.name == "wait_idle"), None)
        ended = r.job_end_time  # whole seconds: the step may end within that second
        idle_end = r.idle_completed_at or (idle.finished_at if idle else None)
        if idle and idle_end and ended and idle_end < ended:
            out.append(
                f"wait_idle ended {idle_end:%H:%M:%S.%f} before the held job did ({ended:%H:%M:%S})"
            )
    else:
        if r.job_restart_cnt != 1:
            out.append(f"job restarts {r.job_restart_cnt}, not 1")
        if r.job_admin_comment != f"autoclusters:requeue:{r.incident_id}:0":
            out.append(f"job AdminComment {r.job_admin_comment!r}")
    if r.status == "resolved" and r.node_drained:
        out.append(f"resolved, yet left {r.node_state} ({r.node_reason})")
    if r.k8s_cordoned:
        out.append("left cordoned in Kubernetes")
    ghosts = ghost_jobs(r)
    if r.status == "resolved" and ghosts:
        out.append(
            f"returned with jobs Slurm places on it that cannot be running: {ghosts} "
            "(started before the repair)"
        )
    lost = [j for j in r.requeued_unlisted if j not in r.vanished_jobs]
    if lost:
        out.append(f"requeued jobs {lost} no longer in Slurm and not reported as vanished")
    if case.component == "temporal":
        lag = restart_lag_s(r)
        if lag is not None and lag > TEMPORAL_RESTART_LAG_BOUND_S:
            out.append(
                f"the step completed {lag:.1f}s after it could have (Temporal back, its wait "
                f"over): past the {TEMPORAL_RESTART_LAG_BOUND_S:.0f}s a restart may add"
            )
    if isinstance(case, CrashCase):
        out += crash_problems(case, r)
    return out


def crash_problems(case: CrashCase, r: OutageReport) -> list[str]:
    """A crash case's own: slurmctld crashed within a second after the write it names,
    and the restarted controller forgot what the case is about."""
    c = r.crash
    if c is None or c.after is None:
        return ["slurmctld was not crashed (or not read after its restart)"]
    out = []
    if case.moment in KIND_OF and (c.lag_s is None or not 0 <= c.lag_s < 1):
        out.append(f"SIGKILL {c.lag_s}s after the {case.moment}, not within a second")
    want = MUST_FORGET.get(case.moment)
    if want and not any(f.startswith(want) for f in c.forgot):
        out.append(f"the restarted controller forgot {c.forgot or 'nothing'}, not {want.strip()}")
    return out


def ghost_jobs(r: OutageReport) -> list[int]:
    """Jobs Slurm places on the node at the report that started before its first repair:
    their processes went with the machine, whatever Slurm shows."""
    repair = next((s for s in r.steps if s.name == "repair"), None)
    if repair is None:
        return []
    return [
        j.job_id
        for j in r.jobs_on_node
        if j.start_time is not None and j.start_time < repair.started_at
    ]


def describe(case: OutageCase, r: OutageReport) -> str:
    """One line: what happened in the case."""
    down = f"{r.outage.down_s:.1f}s" if r.outage else "never"
    ops = [f"{o.action} {o.state} @{o.started_at:%H:%M:%S.%f}" for o in r.cloud_ops]
    return (
        f"{case.id} on {r.node}: {r.status}; away {down}, landed {r.landed_down} -> "
        f"{r.landed_up} (step hit: {r.hit_step}); repairs={r.repairs} cloud={ops}; "
        f"job {r.job_id} {r.job_state} restarts={r.job_restart_cnt} ended={r.job_end_time} "
        f"last running={r.job_last_running_at}; node {r.node_state} {r.node_reason!r} "
        f"cordoned={r.k8s_cordoned}; shown={r.outage_shown}; notes={r.notes}; "
        f"{r.duration_s:.0f}s\n    steps: " + timeline(r)
    )


def timeline(r: OutageReport) -> str:
    """The incident's steps, offsets from its opening: `drain +1.2s 0.1s ok`, details."""
    out = []
    for s in r.steps:
        took = f" {(s.finished_at - s.started_at).total_seconds():.1f}s" if s.finished_at else ""
        at = (s.started_at - r.opened_at).total_seconds()
        detail = f" [{s.detail}]" if s.detail else ""
        out.append(f"{s.name} +{at:.1f}s{took} {s.outcome}{detail}")
    return "; ".join(out)


def every_case_a_first_incident(cfg: SandboxConfig) -> None:
    """Matrices reuse the sandbox's nodes: an earlier case's incident on a node must not
    count as a recurrence (which would start the next one a rung up, at `replace`). The
    policy file is read at every opening."""
    policy = yaml.safe_load(cfg.policy_file.read_text())
    policy["recurrence_window_s"] = 1
    cfg.policy_file.write_text(yaml.safe_dump(policy, sort_keys=False))
