"""`sandbox outage COMPONENT --for SECONDS`: one dependency of a running sandbox goes away
for a while (stopped by its recorded PID, started again on the same state, as `sandbox
restart` does), and `run_outage_case`: an incident in which that component is away once a
given step has started (sandbox/drivers/outage_matrix.py runs it for every pair that matters).

Every system the runbook talks to (slurmctld, the Kubernetes API, the Crusoe API, Slack,
Temporal itself) can be away for a minute in production: a controller restart, a failover,
a throttled API. What must hold then: the incident still resolves, its timeline says what
was away and for how long, the cloud is asked for one operation per repair, a requeueable
job is requeued once, and nothing is repaired under a running job. The report gathers what
a test or the benchmark needs to check exactly that, each fact from its own source (the
Crusoe emulator's record, Slurm, the Kubernetes emulator), not from our side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel
from rich.console import Console
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from autoclusters.clients import incidents
from autoclusters.core import hostlist
from autoclusters.core.models import IncidentState, StepRecord
from autoclusters.core.policy import Rung
from autoclusters.core.settings import load_file
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import cluster, monitoring, restart
from autoclusters.sandbox.crusoe import cloud_api
from autoclusters.sandbox.drivers.chaos import STEPS, _closed, cloud_operations
from autoclusters.sandbox.drivers.controller_crash import ControllerCrash, CrashReport, epoch
from autoclusters.sandbox.drivers.history_ticks import HistoryTicks
from autoclusters.sandbox.machines import names as machine_names
from autoclusters.sandbox.machines.hardware import Hardware, HardwareFault
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import kubernetes_mode as slinky
from autoclusters.workflows.remediation import NodeRemediation

# What may be taken away: the short name an operator types -> the process-table name
# (sandbox/restart.py `_spec` knows how to start each again and when it is ready).
COMPONENTS: dict[str, str] = {
    "slurmctld": "slurmctld",
    "k8s": slinky.K8S_EMULATOR,
    "crusoe": cloud_api.CRUSOE_EMULATOR,
    "slack": cluster.SLACK,
    "temporal": "temporal",
    "prometheus": monitoring.PROMETHEUS,
    "alertmanager": monitoring.ALERTMANAGER,
    "api": cluster.API,
}

# The emulator saves its state just before it stops: an operation it fails then may end a
# moment before the process has exited.
_SLACK_S = timedelta(seconds=2)
# "slurmctld unreachable for 14 s", "Kubernetes API unavailable ... for 3.5 s": what the
# incident's timeline says about an outage it rode out.
_SHOWN = re.compile(r"(?:unreachable|unavailable)\b[^;]*?\bfor (\d+(?:\.\d+)?) ?s\b")


class OutageError(RuntimeError):
    pass


def process_name(component: str) -> str:
    """A short name (or the process-table name itself) -> the process-table name."""
    if component in COMPONENTS:
        return COMPONENTS[component]
    if component in COMPONENTS.values():
        return component
    allowed = ", ".join(COMPONENTS)
    raise OutageError(
        f"{component!r} is not a component an outage can take away; one of: {allowed}"
    )


# --- taking a component away ---------------------------------------------------------------


# The activity each step runs (activities/contracts.py): its completion event in
# the history is the step's end as Temporal recorded it, not workflow time.
STEP_ACTIVITY = {
    "drain": "drain_node",
    "requeue": "requeue_jobs",
    "wait_idle": "wait_node_idle",
    "repair": "repair_node",
    "health_gate": "health_gate",
    "return_to_service": "return_to_service",
}


class OutageDone(BaseModel):
    component: str  # the process-table name
    old_pid: int
    new_pid: int
    signal: str  # what stopped the old process
    down_at: datetime  # the old process had exited
    up_at: datetime  # the new one answered ready
    down_s: float  # up_at - down_at: the outage as measured, restart included


def take_away(
    cfg: SandboxConfig, component: str, for_s: float, kill: bool = False, timeout_s: float = 90
) -> OutageDone:
    """Stop `component` (SIGTERM, or SIGKILL with `kill`), keep it away `for_s` seconds,
    start it again on the same state and return once it is ready. Blocks: a harness that
    must keep watching runs it in a thread (asyncio.to_thread)."""
    name = process_name(component)
    down: list[datetime] = []

    def away() -> None:
        down.append(datetime.now(UTC))
        time.sleep(for_s)  # the outage itself: nothing else is touched meanwhile

    done = restart.restart(cfg, name, kill=kill, timeout_s=timeout_s, between=away)
    up = datetime.now(UTC)
    return OutageDone(
        component=name, old_pid=done.old_pid, new_pid=done.new_pid, signal=done.signal,
        down_at=down[0], up_at=up, down_s=(up - down[0]).total_seconds(),
    )  # fmt: skip


def crashed(crash: ControllerCrash) -> OutageDone:
    """`crash` (slurmctld SIGKILLed and started again on its state), as an outage."""
    c = crash.crash()
    return OutageDone(
        component="slurmctld", old_pid=c.old_pid, new_pid=c.new_pid, signal="SIGKILL",
        down_at=c.down_at, up_at=c.up_at, down_s=c.down_s,
    )  # fmt: skip


# --- watching the case's job ----------------------------------------------------------------


def squeue_job(cfg: SandboxConfig, job_id: int, timeout_s: float = 10) -> dict[str, Any] | None:
    """The job as `squeue --json` lists it (ended jobs stay for MinJobAge), with the fields
    SlurmJob leaves out (end_time); None if not listed. Raises while slurmctld is away."""
    out = subprocess.run(
        [daemons.require("squeue"), "--json"],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True, text=True, check=True, timeout=timeout_s,
    ).stdout  # fmt: skip
    jobs: list[dict[str, Any]] = json.loads(out).get("jobs", [])
    return next((j for j in jobs if int(j["job_id"]) == job_id), None)


def squeue_all(cfg: SandboxConfig, timeout_s: float = 10) -> list[dict[str, Any]]:
    """Every job `squeue --json` lists (ended ones stay for MinJobAge)."""
    out = subprocess.run(
        [daemons.require("squeue"), "--json"],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True, text=True, check=True, timeout=timeout_s,
    ).stdout  # fmt: skip
    jobs: list[dict[str, Any]] = json.loads(out).get("jobs", [])
    return jobs


def jobs_on_node(jobs: list[dict[str, Any]], node: str) -> list[JobOnNode]:
    """Every job of `jobs` Slurm places on `node` (running, completing, suspended)."""
    return [
        JobOnNode(job_id=int(j["job_id"]), state=_state(j), start_time=epoch(j.get("start_time")))
        for j in jobs
        if _state(j) in ("RUNNING", "COMPLETING", "SUSPENDED")
        and node in hostlist.expand(j.get("nodes") or "")
    ]


def _restart_cnt(job: dict[str, Any]) -> int:
    return int(job.get("restart_cnt") or 0)


def _state(job: dict[str, Any]) -> str:
    state = job.get("job_state", "")
    return str(state[0] if isinstance(state, list) and state else state)


class JobWatch:
    """When the job was last seen running on the node, and first seen off it: the first
    stint only (a requeued job may come back to the node once it is in service)."""

    def __init__(
        self, cfg: SandboxConfig, job_id: int, node: str, first_restart_cnt: int | None = None
    ) -> None:
        self.cfg, self.job_id, self.node = cfg, job_id, node
        self.last_running_at: datetime | None = None
        self.off_node_at: datetime | None = None
        # The first stint's restart count: as read before the incident where the case did
        # (a watch whose every read came after the requeue would take the job's run on the
        # node after its return for the first stint), else as first seen.
        self._first_restart_cnt = first_restart_cnt

    async def run(self, every_s: float = 0.5) -> None:
        while self.off_node_at is None:
            # What squeue says was true somewhere between the ask and the answer, which on
            # a loaded machine are seconds apart: "running" is stamped at the ask (the
            # latest moment it is sure of), "off the node" at the answer.
            asked = datetime.now(UTC)
            try:
                job = await asyncio.to_thread(squeue_job, self.cfg, self.job_id, 5)
            except (subprocess.SubprocessError, OSError, ValueError):
                await asyncio.sleep(every_s)  # slurmctld away: nothing known, keep watching
                continue
            now = datetime.now(UTC)
            if job is not None and self._later_stint(job):
                # Requeued since it was last seen: the first stint ended unseen (squeue slow
                # or away all the while). Running here again is not the first stint.
                self.off_node_at = now
            elif job is not None and self._running_here(job):
                self.last_running_at = asked
                if self._first_restart_cnt is None:
                    self._first_restart_cnt = _restart_cnt(job)
            elif job is None or self.last_running_at is not None:
                self.off_node_at = now  # ended, requeued, or gone from the list
            await asyncio.sleep(every_s)

    def _later_stint(self, job: dict[str, Any]) -> bool:
        first = self._first_restart_cnt
        return first is not None and _restart_cnt(job) > first

    def _running_here(self, job: dict[str, Any]) -> bool:
        return _state(job) == "RUNNING" and self.node in hostlist.expand(job.get("nodes") or "")


# --- one case: an incident with the component away at a step --------------------------------


class CloudOp(BaseModel):
    action: str
    vm_id: str
    state: str
    started_at: datetime
    completed_at: datetime | None = None


class JobOnNode(BaseModel):
    job_id: int
    state: str
    start_time: datetime | None = None


class OutageReport(BaseModel):
    incident_id: str
    node: str
    component: str  # the short name
    at: str  # the step asked for
    for_s: float
    status: str
    outage: OutageDone | None = None  # None: the incident never reached `at`
    # Where the outage really landed: the current step when the component went down and
    # when it was back (a short step may be over before the process has exited).
    landed_down: str | None = None
    landed_up: str | None = None
    # Did the step asked for run while the component was away? A step of a few tens of
    # milliseconds (drain, requeue) is often over before a SIGTERMed process has exited.
    hit_step: bool = False
    steps: list[StepRecord] = []  # the incident's timeline as it closed
    outage_shown: list[str] = []  # "step: detail" of the steps whose detail names an outage
    max_outage_shown_s: float | None = None
    repairs: list[str] = []  # the rung of each repair that succeeded
    cloud_ops: list[CloudOp] = []  # the Crusoe emulator's record on the node since opening
    job_id: int | None = None
    job_state: str | None = None
    job_restart_cnt: int | None = None
    job_admin_comment: str | None = None
    job_end_time: datetime | None = None  # Slurm's, for a job that has ended
    job_last_running_at: datetime | None = None  # last seen running on the node
    job_off_node_at: datetime | None = None  # first seen off it
    job_listed: bool = True  # squeue still lists the job (any state) at the report
    requeued_jobs: list[int] = []  # the incident's own record
    requeued_unlisted: list[int] = []  # of those, the ones squeue no longer lists
    vanished_jobs: list[int] = []  # requeued jobs the incident reports Slurm lost
    # Every job Slurm places on the node at the report, and when each started: one that
    # started before the repair is a ghost (its processes went with the machine).
    jobs_on_node: list[JobOnNode] = []
    crash: CrashReport | None = None  # a controller crash's own record (ControllerCrash)
    # When the last wait_node_idle activity completed, from the history's own event: the
    # step's finished_at is workflow time, which after a workflow task timed out (Temporal
    # away) can be the time of the task before it.
    idle_completed_at: datetime | None = None
    # The same for the activity of the step the case asked for (STEP_ACTIVITY).
    step_completed_at: datetime | None = None
    node_state: str = ""  # Slurm's display state afterwards (IDLE, IDLE+DRAIN, ...)
    node_reason: str = ""
    node_drained: bool = False
    k8s_cordoned: bool | None = None  # None: no Kubernetes in this sandbox
    opened_at: datetime
    duration_s: float = 0.0  # opening -> the report
    notes: list[str] = []


def shown_outages(steps: list[StepRecord]) -> tuple[list[str], float | None]:
    """The steps whose detail says something was away, and the longest such time."""
    shown, longest = [], None
    for s in steps:
        found = [float(m) for m in _SHOWN.findall(s.detail)]
        if found or "unreachable" in s.detail or "unavailable" in s.detail:
            shown.append(f"{s.name}: {s.detail}")
        if found:
            longest = max([*found, *([longest] if longest is not None else [])])
    return shown, longest


def _step_at(log: Sequence[tuple[datetime, str | None]], when: datetime, after: bool) -> str | None:
    """The current step at `when` from the poll log: the last observation before it, or
    with `after` the first one after it (a Temporal outage leaves a gap in the log)."""
    before = [s for t, s in log if t <= when]
    later = [s for t, s in log if t >= when]
    if after:
        return later[0] if later else (before[-1] if before else None)
    return before[-1] if before else (later[0] if later else None)


def k8s_cordoned(cfg: SandboxConfig, node: str) -> bool | None:
    if not cfg.k8s:
        return None
    nodes = httpx.get(f"{cfg.k8s_url}/_emulator/state", timeout=10, verify=cfg.k8s_tls()).json()[
        "nodes"
    ]
    return any(
        n["metadata"]["name"] == node and bool(n.get("spec", {}).get("unschedulable"))
        for n in nodes
    )


async def run_outage_case(
    cfg: SandboxConfig,
    component: str,
    at: str,
    for_s: float,
    node: str,
    *,
    job_id: int | None = None,
    release: Path | None = None,
    release_after_s: float = 25.0,
    fault: str = "XID_79",
    kill: bool = False,
    timeout_s: float = 300,
    console: Console | None = None,
    poll_s: float = 1.0,
    crash: ControllerCrash | None = None,
) -> OutageReport:
    """Open a `fault` incident on `node` (its GPU really broken until a reboot), take
    `component` away for `for_s` seconds once the incident's step `at` has started, keep
    watching meanwhile, wait for the incident to close and report. `job_id`: the job the
    test runs on the node (watched; its Slurm record is reported). `release`: a file that
    ends a held job, created `release_after_s` after the outage starts. `crash`: slurmctld
    crashed at the crash's own moment instead (sandbox/drivers/controller_crash.py: after one of the
    runbook's Slurm writes, or at a step). The incident is read at each new event of its
    history (sandbox/drivers/history_ticks.py), and at least every `poll_s`."""
    console = console or Console(stderr=True)
    name = process_name(component)
    if at not in STEPS:
        raise OutageError(f"step {at!r}: expected one of {', '.join(STEPS)}")
    settings = load_file(cfg.settings_file)
    # The case's job as the case began: its name (its id may be handed out again) and its
    # restart count (the first stint's, for the JobWatch).
    job_name: str | None = None
    first_restarts: int | None = None
    if job_id is not None:
        first = await asyncio.to_thread(squeue_job, cfg, job_id)
        if first:
            job_name, first_restarts = str(first.get("name") or ""), _restart_cnt(first)
    if crash is not None:
        # The save window, before the incident's first write (and before the fault: the
        # node's agent would open an incident of its own while this waits).
        await crash.prepare()
    vm = machine_names.vm_of(cfg, node)
    if vm is not None:
        Hardware(cfg.state_dir).inject(
            node, vm.vm_id, HardwareFault(fault=fault, fixed_by=Rung.REBOOT)
        )
    client: Client = await temporal.connect(settings)
    since = datetime.now(UTC)
    started = time.monotonic()
    opened = await incidents.open_incident(client, settings, node, fault, opened_by="outage")
    console.print(f"outage: {fault} on {node}: incident {opened.incident_id}")
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    )
    watch = JobWatch(cfg, job_id, node, first_restarts) if job_id is not None else None
    watcher = asyncio.create_task(watch.run()) if watch else None
    away: asyncio.Task[OutageDone] | None = None
    releaser: asyncio.Task[None] | None = None
    log: list[tuple[datetime, str | None]] = []
    final: IncidentState | None = None
    deadline = time.monotonic() + timeout_s

    def start_away() -> None:
        nonlocal away, releaser
        if away is not None:
            return
        shown = log[-1][1] if log else None
        how = "crashed (SIGKILL)" if crash is not None else "away"
        console.print(f"outage: {name} {how} for {for_s:g}s at {shown}")
        if crash is not None:
            away = asyncio.create_task(asyncio.to_thread(crashed, crash))
        else:
            away = asyncio.create_task(asyncio.to_thread(take_away, cfg, component, for_s, kill))
        if release is not None:
            releaser = asyncio.create_task(_touch_later(release, release_after_s))

    if crash is not None:
        crash.arm(start_away)
    ticks = await HistoryTicks(handle).__aenter__()
    try:
        while final is None:
            if time.monotonic() > deadline:
                # Stalled: say what Temporal holds for it (a task lost with the server
                # waits out a timeout: which one, and since when), then cancel it, so it
                # does not hold the node (and a repair slot) for whatever runs next.
                last = log[-1][1] if log else None
                pending = await _pending_activities(handle)
                with contextlib.suppress(Exception):
                    await handle.cancel()
                raise OutageError(
                    f"incident {opened.incident_id} still open after {timeout_s:.0f}s, "
                    f"last seen at {last} ({component} away at {at}; now cancelled); "
                    f"pending: {pending}"
                )
            try:
                state = await handle.query(NodeRemediation.status)
            except Exception:  # Temporal away, or no worker answers queries yet
                if await _closed(handle):  # a closed incident's result needs no worker
                    with contextlib.suppress(WorkflowFailureError):
                        final = await handle.result()
                        break
                await asyncio.sleep(0.2)
                continue
            log.append((datetime.now(UTC), state.current_step))
            # The step has started (current now, or already over between two polls).
            if away is None and (
                crash.due(state) if crash is not None else any(s.name == at for s in state.steps)
            ):
                start_away()
            if state.status != "open":
                try:
                    final = await handle.result()
                except WorkflowFailureError:
                    final = await handle.query(NodeRemediation.status)
                break
            # Each change of the workflow's state is a workflow task, which ends in an event
            # of its history: a short step (over in tens of ms) is still seen.
            await ticks.wait(poll_s)
    finally:
        await ticks.__aexit__(None, None, None)
        # Whatever happened, the component comes back and no held job is left behind
        # before anything is read (or the next case starts).
        done = await away if away is not None else None
        if releaser is not None:
            releaser.cancel()
        if release is not None:
            release.touch()
        if watcher is not None:
            watcher.cancel()
        if crash is not None:
            await crash.close()
    if done is not None:
        console.print(
            f"outage: {name} back after {done.down_s:.1f}s (pid {done.old_pid} -> {done.new_pid})"
        )
    report = await _report(
        cfg, component, at, for_s, node, opened.incident_id, final, done, log, since,
        started, job_id, watch, job_name,
    )  # fmt: skip
    report.idle_completed_at = await _completed_at(handle, "wait_node_idle")
    if at in STEP_ACTIVITY:
        report.step_completed_at = await _completed_at(handle, STEP_ACTIVITY[at])
    if crash is not None:
        report.crash = crash.report
        report.notes.append(crash.report.describe())
    return report


async def _completed_at(handle: WorkflowHandle[Any, Any], activity: str) -> datetime | None:
    """When the last `activity` of the run completed, as its history records it."""
    scheduled: dict[int, str] = {}
    last: datetime | None = None
    try:
        async for e in handle.fetch_history_events():
            if e.HasField("activity_task_scheduled_event_attributes"):
                name = e.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[e.event_id] = name
            elif e.HasField("activity_task_completed_event_attributes"):
                sid = e.activity_task_completed_event_attributes.scheduled_event_id
                if scheduled.get(sid) == activity:
                    last = e.event_time.ToDatetime(tzinfo=UTC)
    except Exception:  # the report matters more than this detail
        return None
    return last


async def _pending_activities(handle: WorkflowHandle[Any, Any]) -> str:
    """The stalled incident's pending activities as Temporal describes them: name, state,
    attempt, when scheduled, last started and heartbeat, and the last failure."""
    try:
        desc = await handle.describe()
    except Exception as e:  # the server away again: unknown, said so
        return f"unknown ({e})"

    def at(ts: Any) -> str:
        return ts.ToDatetime().strftime("%H:%M:%S.%f")[:-3] if ts and ts.seconds else "-"

    rows = []
    for a in desc.raw_description.pending_activities:
        failure = a.last_failure.message[:120] if a.HasField("last_failure") else ""
        rows.append(
            f"{a.activity_type.name} state={a.state} attempt={a.attempt} "
            f"scheduled={at(a.scheduled_time)} started={at(a.last_started_time)} "
            f"heartbeat={at(a.last_heartbeat_time)} failure={failure!r}"
        )
    return "; ".join(rows) or "no activity pending (a workflow task, or a timer)"


async def _touch_later(path: Path, after_s: float) -> None:
    await asyncio.sleep(after_s)
    path.touch()


async def _report(
    cfg: SandboxConfig, component: str, at: str, for_s: float, node: str, incident_id: str,
    final: IncidentState, done: OutageDone | None, log: list[tuple[datetime, str | None]],
    since: datetime, started: float, job_id: int | None, watch: JobWatch | None,
    job_name: str | None = None,
) -> OutageReport:  # fmt: skip
    shown, longest = shown_outages(final.steps)
    report = OutageReport(
        incident_id=incident_id, node=node, component=component, at=at, for_s=for_s,
        status=final.status, outage=done, steps=final.steps, outage_shown=shown,
        max_outage_shown_s=longest, opened_at=since, requeued_jobs=final.requeued_jobs,
        vanished_jobs=[j.job_id for j in final.vanished_jobs],
        repairs=[
            s.detail.split(":")[0] for s in final.steps if s.name == "repair" and s.outcome == "ok"
        ],
    )  # fmt: skip
    if done is None:
        report.notes.append(f"the incident never reached {at}: {component} was not taken away")
    else:
        report.landed_down = _step_at(log, done.down_at, after=False)
        report.landed_up = _step_at(log, done.up_at, after=True)
        report.hit_step = any(
            s.name == at
            and s.started_at <= done.up_at
            and (s.finished_at is None or s.finished_at >= done.down_at)
            for s in final.steps
        )
    report.cloud_ops = [
        CloudOp(
            action=str(o["action"]), vm_id=str(o["vm_id"]), state=str(o["state"]),
            started_at=datetime.fromisoformat(str(o["started_at"])),
            completed_at=datetime.fromisoformat(str(o["completed_at"]))
            if o.get("completed_at") else None,
        )
        for o in await asyncio.to_thread(cloud_operations, cfg, node, since)
    ]  # fmt: skip
    if job_id is not None:
        job = await asyncio.to_thread(squeue_job, cfg, job_id)
        report.job_id = job_id
        if job is None:
            report.job_listed = False
            report.notes.append(f"job {job_id} no longer listed by squeue")
        else:
            report.job_state = _state(job)
            report.job_restart_cnt = int(job.get("restart_cnt") or 0)
            report.job_admin_comment = str(job.get("admin_comment") or "")
            end = int(job.get("end_time") or 0)
            if report.job_state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT") and end:
                report.job_end_time = datetime.fromtimestamp(end, UTC)
        if watch is not None:
            report.job_last_running_at = watch.last_running_at
            report.job_off_node_at = watch.off_node_at
    listed = await asyncio.to_thread(squeue_all, cfg)
    report.jobs_on_node = jobs_on_node(listed, node)
    names = {int(j["job_id"]): str(j.get("name") or "") for j in listed}
    report.requeued_unlisted = [
        j for j in final.requeued_jobs
        if j not in names
        # The same id, another job: a controller that came back from an older state hands
        # out again the ids it had handed out since (a requeue moves a job's submit time).
        or (j == job_id and job_name is not None and names[j] != job_name)
    ]  # fmt: skip
    slurm_node = await SlurmCli(cfg.slurm_conf).node(node)
    if slurm_node is not None:
        report.node_state = slurm_node.display_state
        report.node_reason = slurm_node.reason
        report.node_drained = slurm_node.drained
    report.k8s_cordoned = await asyncio.to_thread(k8s_cordoned, cfg, node)
    report.duration_s = time.monotonic() - started
    return report


def ops_cut_short(report: OutageReport) -> list[CloudOp]:
    """Operations that ended FAILED while the Crusoe emulator was away: it fails what a stop
    interrupts (sandbox/crusoe/world.py), which did nothing, so the repair must ask again."""
    o = report.outage
    if o is None or o.component != cloud_api.CRUSOE_EMULATOR:
        return []
    return [
        op
        for op in report.cloud_ops
        if op.state == "FAILED"
        and op.completed_at is not None
        and o.down_at - _SLACK_S <= op.completed_at <= o.up_at
    ]


def ops_under_job(report: OutageReport) -> list[CloudOp]:
    """Cloud operations that started while the job still ran on the node: one that started
    before Slurm's end time (whole seconds), or before the job was last seen running.

    Slurm's end time is its last stint's: of a job requeued (restart count > 0) that ran
    again after the repair and then ended, it is later than any repair. Such a job's first
    stint is the one the repair must follow, and only the watch saw when it ended."""
    end = report.job_end_time if not report.job_restart_cnt else None
    bad = []
    for op in report.cloud_ops:
        if end is not None and op.started_at < end:
            bad.append(op)
        elif report.job_last_running_at is not None and op.started_at <= report.job_last_running_at:
            bad.append(op)
    return bad
