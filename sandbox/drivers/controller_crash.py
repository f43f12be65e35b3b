"""A controller that forgets: slurmctld crashed as a real controller crashes (SIGKILL, no
clean state save), kept down a while, then started again on its own StateSaveLocation, at a
moment of an incident: within a second after one of the runbook's Slurm writes (`drain`,
`requeue`, `resume`, read from slurmctld's own log), when a step starts (`repair`) or once a
step has completed (`after:STEP`, from the incident's `status` query).

What decides what the restarted controller forgets (Slurm 22.05.8, `src/slurmctld/
state_save.c`; measured on a sandbox, docs/operations.md "A controller that forgets"):

- slurmctld saves its state in a background pass, at most every SAVE_MAX_WAIT = 5 s (whole
  seconds, so 4-5 s): a write that comes 5 s or more after the last pass is saved at once
  (the files are rewritten within 10 ms); one that comes sooner waits for the pass at the
  last one's second + 5. A crash rolls back exactly the writes of that wait.
- So a lone `scontrol requeue` is never rolled back by a crash a second later, but the
  runbook's requeue comes ~0.2 s after its drain: the drain starts a pass, the requeue
  waits for the next, and a SIGKILL up to 4.5 s after the requeue rolls it back (the job
  is RUNNING again with Restarts=0 on the drained node, its processes gone: a ghost).
- `scancel` of a PENDING job schedules no save at all: a crash before any later job change
  brings the job back, and it runs once its requeue hold ends.

`poke_save` starts a pass now (a partition written with the value it has), so that the next
write waits for the one after it: a busy controller, whose saves always lag its writes by up
to 5 s. `hold_saves` makes the passes fail for a kind of state (`job_state.new` a directory:
slurmctld cannot create its new file and keeps the old one, "Can't save state ... Is a
directory" in its log), as a stalled StateSaveLocation would: whatever changed since is
forgotten at the crash, however long after it comes. The crash gives the held kinds back
before slurmctld starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from autoclusters.core import hostlist
from autoclusters.core.models import REASON_PREFIX, IncidentState
from autoclusters.core.unavailable import DB_INDEX_REFUSAL
from autoclusters.sandbox import restart
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig

# Where the crash lands: after one of the runbook's Slurm writes (slurmctld's log says when
# it made it), when the repair starts, or `after:STEP` once the incident's STEP completed.
WRITES = ("drain", "requeue", "resume")
MOMENTS = (*WRITES, "repair")
AFTER = "after:"
# The incident's step in which each moment falls (the outage matrix's `at`).
STEP_OF = {
    "drain": "drain",
    "requeue": "requeue",
    "resume": "return_to_service",
    "repair": "repair",
}
# The state files slurmctld rewrites in each pass (StateSaveLocation/<kind>).
KINDS = ("job_state", "node_state")
# No pass for this long: nothing is waiting to be saved (a pass comes at most 5 s after a
# change), so the next write starts a pass at once.
QUIET_S = 6.0
# A busy controller: a write every 2 s keeps a pass waiting at all times, so every write
# waits up to 5 s to be saved.
BUSY_EVERY_S = 2.0
# What slurmctld logs when a pass cannot write a kind (a held one).
_SAVE_FAILED = "error: Can't save state"
_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)\] (.*)$")


class CrashError(RuntimeError):
    pass


def parse_moment(moment: str) -> tuple[str, str | None]:
    """`requeue` -> ("write", "requeue"), `repair` -> ("start", "repair"),
    `after:wait_idle` -> ("after", "wait_idle")."""
    if moment in WRITES:
        return "write", moment
    if moment == "repair":
        return "start", moment
    if moment.startswith(AFTER) and moment.removeprefix(AFTER):
        return "after", moment.removeprefix(AFTER)
    raise CrashError(f"moment {moment!r}: expected one of {', '.join(MOMENTS)} or after:STEP")


# --- slurmctld's files ----------------------------------------------------------------------


def _conf_value(cfg: SandboxConfig, key: str) -> str:
    for line in cfg.slurm_conf.read_text().splitlines():
        name, _, value = line.partition("=")
        if name.strip().lower() == key.lower():
            return value.split("#", 1)[0].strip()
    raise CrashError(f"{cfg.slurm_conf} sets no {key}")


def state_save_dir(cfg: SandboxConfig) -> Path:
    return Path(_conf_value(cfg, "StateSaveLocation"))


def controller_log(cfg: SandboxConfig) -> Path:
    return Path(_conf_value(cfg, "SlurmctldLogFile"))


def saved_at(cfg: SandboxConfig) -> dict[str, datetime]:
    """When slurmctld last rewrote each kind of state (the file's mtime)."""
    out = {}
    for kind in KINDS:
        with contextlib.suppress(FileNotFoundError):
            mtime = (state_save_dir(cfg) / kind).stat().st_mtime
            out[kind] = datetime.fromtimestamp(mtime, UTC)
    return out


def last_pass(cfg: SandboxConfig) -> float:
    """The time of slurmctld's last save pass: the newest of its state files (each pass
    rewrites at least one of them), or of the failures its log reports for held kinds."""
    files = [p for p in state_save_dir(cfg).glob("*_state") if p.is_file()]
    newest = max((p.stat().st_mtime for p in files), default=0.0)
    log = controller_log(cfg)
    if log.exists():
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 65536))
            tail = f.read().decode(errors="replace").splitlines()
        for raw in reversed(tail):
            m = _LOG_LINE.match(raw)
            if m and m.group(2).startswith(_SAVE_FAILED):
                failed = datetime.fromisoformat(m.group(1)).astimezone(UTC).timestamp()
                newest = max(newest, failed)
                break
    return newest


async def quiet_saves(cfg: SandboxConfig, quiet_s: float = QUIET_S, timeout_s: float = 60) -> bool:
    """Until slurmctld has made no save pass for `quiet_s`: nothing waits to be saved, so
    its next write is saved at once and starts a fresh 5 s window. False after
    `timeout_s` (a busy controller never falls quiet)."""
    deadline = time.monotonic() + timeout_s
    while time.time() - last_pass(cfg) < quiet_s:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


def _slurm(cfg: SandboxConfig, *argv: str, timeout_s: float = 15) -> str:
    return subprocess.run(
        [daemons.require(argv[0]), *argv[1:]],
        env={**os.environ, **daemons.slurm_env(cfg)},
        capture_output=True, text=True, check=True, timeout=timeout_s,
    ).stdout  # fmt: skip


def poke_save(cfg: SandboxConfig) -> None:
    """A write that changes nothing (the first partition's MaxTime, set to what it is) and
    so starts a save pass now if none came in the last 5 s: the next write then waits up to
    5 s for the pass after it, as every write does on a busy controller."""
    out = _slurm(cfg, "scontrol", "show", "partition", "--oneliner")
    first = out.splitlines()[0].split()
    fields = dict(f.split("=", 1) for f in first if "=" in f)
    _slurm(
        cfg, "scontrol", "update", f"PartitionName={fields['PartitionName']}",
        f"MaxTime={fields['MaxTime']}",
    )  # fmt: skip


def save_now(cfg: SandboxConfig, timeout_s: float = 15) -> None:
    """Have slurmctld save all its state (`scontrol reconfigure` schedules every kind) and
    wait until it has: nothing from before now is forgotten by a later crash (a cancelled
    pending job included, whose cancel alone is never saved)."""
    asked = time.time()
    _slurm(cfg, "scontrol", "reconfigure")
    deadline = time.monotonic() + timeout_s
    while any(t.timestamp() < asked for t in saved_at(cfg).values()):
        if time.monotonic() > deadline:
            raise CrashError(f"slurmctld did not save its state within {timeout_s:g}s")
        time.sleep(0.05)


def save_accounted(cfg: SandboxConfig, jobs: Sequence[int], timeout_s: float = 60) -> None:
    """Until slurmctld holds each job's database index, then everything saved.

    Slurm before 24.11 gets a job's database index from slurmdbd a few seconds after the
    job starts, and marks it "being set" meanwhile. A crash whose saved state still says so
    leaves the job at that mark after the restart, and slurmctld refuses every update of it
    ("the DB index is being set, try again in a bit") for as long as it runs (ci16: the
    requeue's marker waited past the case's bound). A crash case means the crash at its
    moment, not that race: its jobs are accounted for and saved first. Nothing to wait for
    without accounting.

    slurmdbd listing the job is not enough: slurmctld takes the index from slurmdbd's
    answer, which it may not have read yet (ci27: `sacct` listed a job 0.4 s after its
    submission, the state saved then still said "being set"). So slurmctld itself is
    asked: an update of the job, to what it already is, is refused while it waits."""
    if not cfg.accounting or not jobs:
        return
    ids = ",".join(str(j) for j in jobs)
    deadline = time.monotonic() + timeout_s
    while True:
        out = _slurm(cfg, "sacct", "-n", "-X", "-P", "-o", "JobID", "-j", ids)
        if {str(j) for j in jobs} <= set(out.split()):
            break
        if time.monotonic() > deadline:
            raise CrashError(f"slurmdbd has no start of jobs {ids} after {timeout_s:g}s")
        time.sleep(0.2)
    for job in jobs:
        while not db_index_set(cfg, job):
            if time.monotonic() > deadline:
                raise CrashError(f"slurmctld has no DB index of job {job} after {timeout_s:g}s")
            time.sleep(0.2)
    save_now(cfg)


def db_index_set(cfg: SandboxConfig, job: int) -> bool:
    """Does slurmctld hold the job's database index? Its AdminComment set to what it is
    (nothing else writes it before the runbook's requeue): slurmctld refuses any update of
    a job whose index is being set, after waiting 5 s for it (`_slurm_rpc_update_job`)."""
    listed = json.loads(_slurm(cfg, "squeue", "--json", "-j", str(job))).get("jobs", [])
    if not listed:
        return True  # ended: nothing will update it
    comment = str(listed[0].get("admin_comment") or "")
    try:
        _slurm(cfg, "scontrol", "update", f"JobId={job}", f"AdminComment={comment}", timeout_s=30)
    except subprocess.CalledProcessError as e:
        if DB_INDEX_REFUSAL in str(e.stderr).lower():
            return False
        raise CrashError(f"job {job}: {str(e.stderr).strip()}") from None
    return True


def hold_saves(cfg: SandboxConfig, kinds: Sequence[str] = ("job_state",)) -> datetime:
    """Everything saved now (`save_now`), then until `release_saves` slurmctld's passes
    fail for `kinds`: it writes each to `<kind>.new` first, which is now a directory.
    Returns when the hold began."""
    save_now(cfg)
    for kind in kinds:
        new = state_save_dir(cfg) / f"{kind}.new"
        deadline = time.monotonic() + 5
        while not new.is_dir():
            try:
                new.mkdir()
            except FileExistsError:  # slurmctld is writing it this instant: its pass ends
                if time.monotonic() > deadline:
                    raise CrashError(f"{new} stays a file: cannot hold {kind}") from None
                time.sleep(0.01)
    return datetime.now(UTC)


def release_saves(cfg: SandboxConfig) -> list[str]:
    """Give back every held kind (idempotent); the kinds that were held."""
    released = []
    for kind in KINDS:
        new = state_save_dir(cfg) / f"{kind}.new"
        if new.is_dir():
            new.rmdir()
            released.append(kind)
    return released


class LogLine(BaseModel):
    at: datetime
    text: str


class ControllerLog:
    """slurmctld's log from now on (a restarted slurmctld appends to the same file)."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.path = controller_log(cfg)
        self.offset = self.path.stat().st_size if self.path.exists() else 0
        self._partial = b""

    def read(self) -> list[LogLine]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        data, self._partial = (self._partial + data).rpartition(b"\n")[::2]
        out = []
        for raw in data.decode(errors="replace").splitlines():
            m = _LOG_LINE.match(raw)
            if m:  # slurmctld logs local time
                at = datetime.fromisoformat(m.group(1)).astimezone(UTC)
                out.append(LogLine(at=at, text=m.group(2)))
        return out


# slurmctld's own requeue of a job, and the runbook's requeue marker on a job
# (activities/job_markers.py), as slurmctld logs them.
_REQUEUING = re.compile(r"^Requeuing JobId=(\d+)")
_REQUEUE_MARKER = re.compile(
    r"^_update_job: setting admin_comment to autoclusters:requeue:\S+ for JobId=(\d+)"
)


class WriteWatch:
    """Finds the runbook's Slurm writes on `node` in slurmctld's log: its drain (our reason
    prefix), a requeue of a job, the resume after the drain."""

    def __init__(self, node: str, jobs: Sequence[int] = ()) -> None:
        self.node, self.jobs = node, set(jobs)
        self.seen: dict[str, LogLine] = {}
        self._requeue_marked = False  # the runbook's marker is on a job of the node
        node = re.escape(node)
        self._drain = re.compile(
            rf"^update_node: node {node} reason set to: {re.escape(REASON_PREFIX)} "
        )
        # Not a fence's DOWN: the resume is the return to service.
        self._resume = re.compile(rf"^update_node: node {node} state set to (?!DRAIN|DOWN)")
        self._down = re.compile(rf"^update_node: node {node} state set to DOWN")

    def _ours(self, job_id: str) -> bool:
        return not self.jobs or int(job_id) in self.jobs

    def feed(self, lines: list[LogLine]) -> None:
        drain, resume, down = self._drain, self._resume, self._down
        for line in lines:
            if "drain" not in self.seen and drain.match(line.text):
                self.seen["drain"] = line
            elif "drain" in self.seen and "resume" not in self.seen and resume.match(line.text):
                self.seen["resume"] = line
            m = _REQUEUING.match(line.text)
            if m and "requeue" not in self.seen and self._ours(m[1]):
                self.seen["requeue"] = line
            m = _REQUEUE_MARKER.match(line.text)
            if m and self._ours(m[1]):
                self._requeue_marked = True
            # A fence at once (XID_79's): the node set DOWN right after the marker requeues
            # its jobs with it, and slurmctld logs no `Requeuing` line for them then.
            if self._requeue_marked and "requeue" not in self.seen and down.match(line.text):
                self.seen["requeue"] = line


# --- what the restarted controller shows ----------------------------------------------------


class JobSeen(BaseModel):
    job_id: int
    state: str
    restart_cnt: int
    nodes: str
    start_time: datetime | None = None
    submit_time: datetime | None = None
    admin_comment: str = ""


class SlurmSeen(BaseModel):
    """The node and the jobs as one read of Slurm shows them."""

    at: datetime
    node_state: str = ""  # IDLE+DRAIN, MIXED, ...
    node_reason: str = ""
    node_drained: bool = False
    jobs: dict[int, JobSeen] = {}  # the jobs asked about that Slurm knows
    on_node: list[int] = []  # every job Slurm places on the node (running or completing)


def epoch(value: Any) -> datetime | None:
    """A time squeue --json gives (seconds since the epoch, 0: none)."""
    if isinstance(value, dict):  # newer Slurm: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else 0
    return datetime.fromtimestamp(int(value), UTC) if value else None


def _job_state(job: dict[str, Any]) -> str:
    state = job.get("job_state", "")
    return str(state[0] if isinstance(state, list) and state else state)


def _node_now(cfg: SandboxConfig, node: str) -> tuple[str, str, bool]:
    """(display state, reason, drained) from `scontrol show node` (22.05's sinfo --json
    lays its fields out differently from release to release)."""
    out = _slurm(cfg, "scontrol", "show", "node", node, "--oneliner")
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    state = fields.get("State", "")
    reason = out.split("Reason=", 1)[1].rsplit(" [", 1)[0].strip() if "Reason=" in out else ""
    return state, reason, "DRAIN" in state


def read_slurm(cfg: SandboxConfig, node: str, jobs: Sequence[int] = ()) -> SlurmSeen:
    """The node and `jobs` as Slurm shows them now. Raises while slurmctld is away."""
    seen = SlurmSeen(at=datetime.now(UTC))
    listed = json.loads(_slurm(cfg, "squeue", "--json"))["jobs"]
    for j in listed:
        state = _job_state(j)
        job_id = int(j["job_id"])
        if job_id in jobs:
            seen.jobs[job_id] = JobSeen(
                job_id=job_id, state=state, restart_cnt=int(j.get("restart_cnt") or 0),
                nodes=str(j.get("nodes") or ""), start_time=epoch(j.get("start_time")),
                submit_time=epoch(j.get("submit_time")),
                admin_comment=str(j.get("admin_comment") or ""),
            )  # fmt: skip
        if state in ("RUNNING", "COMPLETING", "SUSPENDED") and node in hostlist.expand(
            str(j.get("nodes") or "")
        ):
            seen.on_node.append(job_id)
    seen.node_state, seen.node_reason, seen.node_drained = _node_now(cfg, node)
    return seen


# --- the crash --------------------------------------------------------------------------------


class Crashed(BaseModel):
    """The crash itself: the PIDs, and from the SIGKILLed process gone to the new one ready."""

    old_pid: int
    new_pid: int
    down_at: datetime
    up_at: datetime

    @property
    def down_s(self) -> float:
        return (self.up_at - self.down_at).total_seconds()


class CrashReport(BaseModel):
    moment: str
    node: str
    for_s: float
    quiet: bool | None = None  # slurmctld had made no save pass for QUIET_S before opening
    poked_at: datetime | None = None  # a pass started just before opening (poke_save)
    busy_from: datetime | None = None  # from then on a pass was started every BUSY_EVERY_S
    writes: dict[str, LogLine] = {}  # the runbook's writes slurmctld logged before the crash
    killed_at: datetime | None = None  # the SIGKILL (its process gone)
    lag_s: float | None = None  # from the write the moment names to the SIGKILL
    saved: dict[str, datetime] = {}  # each kind's last save before the crash
    held: list[str] = []  # kinds whose saves were held (failing) until the crash
    before: SlurmSeen | None = None  # Slurm when the incident opened
    after: SlurmSeen | None = None  # the restarted controller's first answer
    forgot: list[str] = []  # what the restarted controller no longer showed
    down_s: float | None = None  # the SIGKILL -> the new slurmctld answering

    def describe(self) -> str:
        w = self.writes.get(self.moment)
        lag = f", SIGKILL {self.lag_s:.2f}s after it" if self.lag_s is not None else ""
        wrote = f"{self.moment} logged {w.at:%H:%M:%S.%f}"[:-3] + lag if w else self.moment
        down = f"down {self.down_s:.1f}s" if self.down_s is not None else "never crashed"
        saved = {k: f"{v:%H:%M:%S.%f}"[:-3] for k, v in self.saved.items()}
        return (
            f"slurmctld crash at {wrote}; {down}; saved {saved} held {self.held}; "
            f"forgot {self.forgot or 'nothing'}"
        )


# The state file each of the runbook's writes lands in.
KIND_OF = {"drain": "node_state", "resume": "node_state", "requeue": "job_state"}
# slurmctld logs a write just after it made it, and its save pass runs beside: a pass that
# ended this close to the write's log line may or may not hold it.
_SAME_MOMENT_S = 0.05


def unsaved(write: LogLine, kind: str, saved: dict[str, datetime], held: Sequence[str]) -> bool:
    """Was `write` certainly not in the state the crash left? (Its kind held, or last saved
    before it was made.)"""
    last = saved.get(kind)
    return kind in held or (last is not None and (write.at - last).total_seconds() > _SAME_MOMENT_S)


def forgotten(
    before: SlurmSeen | None,
    writes: dict[str, LogLine],
    after: SlurmSeen,
    node: str,
    saved: dict[str, datetime] | None = None,
    held: Sequence[str] = (),
) -> list[str]:
    """What the restarted controller came back without: each write it logged before the
    crash that was not in its saved state (`saved`: each kind's last save before the crash)
    or that its first answer contradicts, and each job it knew at the opening that it no
    longer knows. (The runbook may redo a write before that first answer: a resume retried
    on a node slurmctld still shows UNKNOWN clears its drain though Slurm calls it invalid.)"""
    saved = saved or {}

    def lost(what: str) -> bool:
        return unsaved(writes[what], KIND_OF[what], saved, held)

    out = []
    if "drain" in writes and "resume" not in writes and (lost("drain") or not after.node_drained):
        out.append(f"the drain of {node} (then {after.node_state})")
    if "resume" in writes and (lost("resume") or after.node_drained):
        out.append(f"the resume of {node} (then {after.node_state})")
    for job_id, was in (before.jobs if before else {}).items():
        now = after.jobs.get(job_id)
        if now is None:
            out.append(f"job {job_id} (the controller no longer knows it)")
        elif "requeue" in writes and (lost("requeue") or now.restart_cnt <= was.restart_cnt):
            where = f" on {now.nodes}" if now.nodes else ""
            out.append(
                f"the requeue of job {job_id} (then Restarts={now.restart_cnt}, {now.state}{where})"
            )
    return out


class ControllerCrash:
    """slurmctld SIGKILLed at `moment` of the incident on `node`, down `for_s`, started
    again on its StateSaveLocation. `quiet`: wait before the incident opens until nothing
    waits to be saved (its first write then starts a fresh 5 s window); `poke`: then start
    a pass (its first write waits for the next); `busy_from`: once the incident's step of
    that name has started, start a pass every BUSY_EVERY_S until the crash (every write then
    waits up to 5 s); `hold`: kinds whose saves fail from the opening until the crash.
    `jobs`: the jobs to look at (the requeue watched for, and before and after the
    crash), each accounted for and saved first (`save_accounted`) unless `accounted` is
    False (a job the crash is meant to forget). Run by sandbox/drivers/outage.py
    `run_outage_case(crash=...)`."""

    def __init__(
        self,
        cfg: SandboxConfig,
        moment: str,
        node: str,
        for_s: float,
        *,
        jobs: Sequence[int] = (),
        quiet: bool = True,
        poke: bool = False,
        busy_from: str | None = None,
        hold: Sequence[str] = (),
        timeout_s: float = 90,
        accounted: bool = True,
    ) -> None:
        self.how, self.what = parse_moment(moment)
        self._accounted = accounted
        self.cfg, self.node, self.jobs, self.for_s = cfg, node, list(jobs), for_s
        self._quiet, self._poke, self._hold, self._timeout_s = quiet, poke, list(hold), timeout_s
        self.report = CrashReport(moment=moment, node=node, for_s=for_s)
        self._watch = WriteWatch(node, jobs)
        self._log: ControllerLog | None = None
        self._follower: asyncio.Task[None] | None = None
        self._go: Callable[[], None] = lambda: None
        self._fired = False
        self._busy_from = busy_from
        self._busy: asyncio.Task[None] | None = None

    async def prepare(self) -> None:
        """Before the incident opens: the jobs accounted for, the held kinds, the save
        window, and Slurm as it is."""
        if self._accounted:
            await asyncio.to_thread(save_accounted, self.cfg, self.jobs)
        if self._hold:  # everything saved first: the saved state is Slurm's as of now
            await asyncio.to_thread(hold_saves, self.cfg, self._hold)
        if self._quiet:
            self.report.quiet = await quiet_saves(self.cfg)
        if self._poke:
            await asyncio.to_thread(poke_save, self.cfg)
            self.report.poked_at = datetime.now(UTC)
        self._log = ControllerLog(self.cfg)
        self.report.before = await asyncio.to_thread(read_slurm, self.cfg, self.node, self.jobs)

    def arm(self, go: Callable[[], None]) -> None:
        """The incident is open: `go()` starts the crash (in the caller's loop)."""
        self._go = go
        self._follower = asyncio.create_task(self._follow())

    def due(self, state: IncidentState) -> bool:
        """On each read of the incident: is it time (a step moment)?"""
        if (
            self._busy is None
            and self._busy_from is not None
            and any(s.name == self._busy_from for s in state.steps)
        ):
            self.report.busy_from = datetime.now(UTC)
            self._busy = asyncio.create_task(self._keep_busy())
        if self._fired or self.how == "write":
            return False
        if self.how == "start":
            hit = any(s.name == self.what for s in state.steps)
        else:
            hit = any(s.name == self.what and s.finished_at is not None for s in state.steps)
        self._fired = hit
        return hit

    async def _follow(self) -> None:
        """Read slurmctld's log every 50 ms: every write of the runbook it shows, and for a
        write moment, go at once."""
        assert self._log is not None
        while True:
            lines = await asyncio.to_thread(self._log.read)
            killed = self.report.killed_at
            self._watch.feed([ln for ln in lines if killed is None or ln.at < killed])
            if self.how == "write" and not self._fired and self.what in self._watch.seen:
                self._fired = True
                self._go()
            await asyncio.sleep(0.05)

    async def _keep_busy(self) -> None:
        while not self._fired:
            with contextlib.suppress(subprocess.SubprocessError, OSError, CrashError):
                await asyncio.to_thread(poke_save, self.cfg)
            await asyncio.sleep(BUSY_EVERY_S)

    async def close(self) -> None:
        for task in (self._busy,):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            if self._log is not None:  # what the log had until the crash
                killed = self.report.killed_at
                rest = await asyncio.to_thread(self._log.read)
                self._watch.feed([ln for ln in rest if killed is None or ln.at < killed])
        self.report.writes = dict(self._watch.seen)
        write = self.report.writes.get(self.what or "")
        if write is not None and self.report.killed_at is not None:
            self.report.lag_s = (self.report.killed_at - write.at).total_seconds()
        if self.report.after is not None:
            self.report.forgot = forgotten(
                self.report.before, self.report.writes, self.report.after, self.node,
                self.report.saved, self.report.held,
            )  # fmt: skip
        await asyncio.to_thread(release_saves, self.cfg)  # a crash that never came

    def crash(self) -> Crashed:
        """SIGKILL, down `for_s` (the held kinds given back), started again on its state;
        then the restarted controller's first answer. Blocking: run it in a thread."""

        def left_as_is() -> None:
            # The process is gone: what it had saved is what the new one will read.
            self.report.killed_at = datetime.now(UTC)
            self.report.saved = saved_at(self.cfg)
            self.report.held = release_saves(self.cfg)
            time.sleep(self.for_s)  # the outage itself: nothing else is touched meanwhile

        done = restart.restart(
            self.cfg, "slurmctld", kill=True, timeout_s=self._timeout_s, between=left_as_is
        )
        assert self.report.killed_at is not None
        crashed = Crashed(
            old_pid=done.old_pid, new_pid=done.new_pid, down_at=self.report.killed_at,
            up_at=datetime.now(UTC),
        )  # fmt: skip
        self.report.down_s = crashed.down_s
        try:
            self.report.after = read_slurm(self.cfg, self.node, self.jobs)
        except (subprocess.SubprocessError, OSError, ValueError, KeyError):
            pass  # answered sinfo, not yet squeue: the report says nothing was read
        return crashed


async def crash_at(
    cfg: SandboxConfig,
    moment: str,
    node: str,
    for_s: float,
    *,
    hold: Sequence[str] = (),
    wait_s: float = 600,
    poll_s: float = 1.0,
) -> tuple[CrashReport, Crashed]:
    """`sandbox outage slurmctld --crash --after MOMENT --node NODE`: wait for MOMENT of
    the node's incident (open now, or opened within `wait_s`), then crash slurmctld; the
    jobs looked at are those Slurm places on the node now."""
    from autoclusters.core.models import workflow_id
    from autoclusters.core.settings import load_file
    from autoclusters.integrations import temporal
    from autoclusters.sandbox.drivers.history_ticks import HistoryTicks
    from autoclusters.workflows.remediation import NodeRemediation

    jobs = (await asyncio.to_thread(read_slurm, cfg, node)).on_node
    crash = ControllerCrash(cfg, moment, node, for_s, jobs=jobs, quiet=False, hold=hold)
    await crash.prepare()
    done: asyncio.Task[Crashed] | None = None

    def go() -> None:
        nonlocal done
        if done is None:
            done = asyncio.create_task(asyncio.to_thread(crash.crash))

    settings = load_file(cfg.settings_file)
    client = await temporal.connect(settings)
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, workflow_id(settings.cluster, node)
    )
    crash.arm(go)
    deadline = time.monotonic() + wait_s
    try:
        async with HistoryTicks(handle) as ticks:
            while done is None:
                if time.monotonic() > deadline:
                    raise CrashError(f"{moment} of {node}'s incident not seen in {wait_s:g}s")
                if crash.how != "write":
                    with contextlib.suppress(Exception):  # no incident (yet), no worker
                        if crash.due(await handle.query(NodeRemediation.status)):
                            go()
                await ticks.wait(poll_s if crash.how != "write" else 0.2)
        outage = await done
    finally:
        if done is not None:
            await asyncio.gather(done, return_exceptions=True)
        await crash.close()
    return crash.report, outage
