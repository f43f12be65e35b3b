"""The controller crash's pure parts, without a sandbox (sandbox/drivers/controller_crash.py): which
moments it takes, how it reads slurmctld's log (the runbook's writes, the times slurmctld
gives them, the passes it could not save), what it says the restarted controller forgot,
how the crash cases are laid out, and the checks they add to the outage matrix (a ghost on
the returned node, a requeued job gone unreported)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoclusters.core.models import StepRecord
from autoclusters.core.unavailable import DB_INDEX_REFUSAL
from autoclusters.sandbox.cli import sandbox_app
from autoclusters.sandbox.drivers import controller_crash
from autoclusters.sandbox.drivers.controller_crash import (
    ControllerLog,
    CrashError,
    CrashReport,
    JobSeen,
    LogLine,
    SlurmSeen,
    WriteWatch,
    forgotten,
    last_pass,
    parse_moment,
    release_saves,
    save_accounted,
    state_save_dir,
)
from autoclusters.sandbox.drivers.outage import CloudOp, JobOnNode, OutageDone, OutageReport
from autoclusters.sandbox.drivers.outage_matrix import (
    CRASH_MOMENTS,
    CrashCase,
    OutageCase,
    crash_matrix,
    ghost_jobs,
    problems,
)
from autoclusters.sandbox.runtime.config import SandboxConfig

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
NODE = "gpu-02"
DRAIN = f"update_node: node {NODE} reason set to: autoclusters: inc-1 XID_79"


def _line(s: float, text: str) -> LogLine:
    return LogLine(at=T0 + timedelta(seconds=s), text=text)


def _cfg(tmp_path: Path) -> SandboxConfig:
    cfg = SandboxConfig(state_dir=tmp_path)
    cfg.slurm_conf.parent.mkdir(parents=True)
    cfg.slurm_conf.write_text(
        f"ClusterName=x\nStateSaveLocation={tmp_path}/ctld\n"
        f"SlurmctldLogFile={tmp_path}/slurmctld.log  # the log\n"
    )
    (tmp_path / "ctld").mkdir()
    return cfg


# --- moments -------------------------------------------------------------------------------


def test_moments_are_a_write_a_step_start_or_a_completed_step() -> None:
    assert parse_moment("requeue") == ("write", "requeue")
    assert parse_moment("resume") == ("write", "resume")
    assert parse_moment("repair") == ("start", "repair")
    assert parse_moment("after:requeue") == ("after", "requeue")
    for bad in ("wait_idle", "after:", "cancel"):
        with pytest.raises(CrashError, match="after:STEP"):
            parse_moment(bad)


def test_the_verb_crashes_at_a_moment_only_slurmctld_with_crash_and_node(tmp_path: Path) -> None:
    base = ["outage", "--for", "1", "--state-dir", str(tmp_path)]
    for extra in (
        ["slurmctld", "--after", "requeue", "--node", NODE],  # no --crash
        ["slurmctld", "--crash", "--after", "requeue"],  # no --node
        ["slack", "--crash", "--after", "requeue", "--node", NODE],
    ):
        r = CliRunner().invoke(sandbox_app, [*base, *extra])
        assert r.exit_code == 2, r.output
        assert "--after crashes slurmctld" in re.sub(r"\s+", " ", r.output)
    r = CliRunner().invoke(sandbox_app, [*base, "slurmctld", "--crash", "--after", "soon"])
    assert r.exit_code == 2 and "moment 'soon'" in r.output, r.output


# --- slurmctld's log and files -------------------------------------------------------------


def test_the_log_is_read_from_where_it_was_and_a_partial_line_waits(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    log = tmp_path / "slurmctld.log"
    log.write_text("[2026-01-01T11:59:00.000] before the watch\n")
    watch = ControllerLog(cfg)
    with log.open("a") as f:
        f.write(f"[2026-01-01T12:00:01.250] {DRAIN}\nnot a line of slurmctld's\n[2026-01-01T12:0")
    lines = watch.read()
    assert [ln.text for ln in lines] == [DRAIN]
    # slurmctld writes local time: read as this machine's local time
    assert lines[0].at == datetime(2026, 1, 1, 12, 0, 1, 250000).astimezone(UTC)
    with log.open("a") as f:
        f.write("0:02.000] Requeuing JobId=7\n")
    assert [ln.text for ln in watch.read()] == ["Requeuing JobId=7"]
    assert watch.read() == []


def test_the_writes_of_the_runbook_are_found_and_nothing_else() -> None:
    watch = WriteWatch(NODE, jobs=[7])
    watch.feed(
        [
            _line(0, f"update_node: node {NODE} state set to IDLE"),  # before our drain
            _line(1, f"update_node: node {NODE} reason set to: slurm-operator: cordoned"),
            _line(2, "update_node: node gpu-03 reason set to: autoclusters: inc-2 XID_79"),
            _line(3, "Requeuing JobId=8"),  # not a job of the case
        ]
    )
    assert watch.seen == {}
    watch.feed(
        [
            _line(4, DRAIN),
            _line(5, f"update_node: node {NODE} state set to DRAINING"),
            _line(6, "Requeuing JobId=7"),
            _line(9, f"update_node: node {NODE} state set to IDLE"),
            _line(10, "Requeuing JobId=7"),  # the first one counts
        ]
    )
    assert {k: (v.at - T0).total_seconds() for k, v in watch.seen.items()} == {
        "drain": 4,
        "requeue": 6,
        "resume": 9,
    }


MARKED = "_update_job: setting admin_comment to autoclusters:requeue:inc-1:0 for JobId="


def test_a_fence_at_once_is_the_requeue_write_and_not_the_resume() -> None:
    """XID_79's fence: the runbook marks its job, then sets the node DOWN at once, which
    requeues the job with it; slurmctld logs no `Requeuing` line for that (ci3 of
    2026-12-06: the crash case at the requeue never crashed)."""
    watch = WriteWatch(NODE, jobs=[7])
    watch.feed(
        [
            _line(4, DRAIN),
            _line(5, f"update_node: node {NODE} state set to DOWN"),  # no marker yet
            _line(
                6, "_update_job: setting admin_comment to autoclusters:requeue:inc-1:0 for JobId=8"
            ),
            _line(7, f"update_node: node {NODE} state set to DOWN"),  # not the case's job
        ]
    )
    assert set(watch.seen) == {"drain"}
    watch.feed(
        [
            _line(
                8, "_update_job: setting admin_comment to autoclusters:requeue:inc-1:0 for JobId=7"
            ),
            _line(9, f"update_node: node {NODE} state set to DOWN"),
            _line(12, f"update_node: node {NODE} state set to IDLE"),
        ]
    )
    assert {k: (v.at - T0).total_seconds() for k, v in watch.seen.items()} == {
        "drain": 4,
        "requeue": 9,
        "resume": 12,
    }


def test_the_last_pass_counts_the_passes_a_hold_made_fail(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    saved = state_save_dir(cfg) / "node_state"
    saved.write_text("x")
    os.utime(saved, (time.time() - 30, time.time() - 30))
    assert last_pass(cfg) == pytest.approx(time.time() - 30, abs=1)
    failed = datetime.now().replace(microsecond=0) - timedelta(seconds=3)  # local, as logged
    (tmp_path / "slurmctld.log").write_text(
        f"[{failed:%Y-%m-%dT%H:%M:%S}.000] error: Can't save state, create file "
        f"{state_save_dir(cfg)}/job_state.new error Is a directory\n"
    )
    assert last_pass(cfg) == pytest.approx(failed.timestamp(), abs=0.01)


def test_releasing_the_saves_gives_back_every_held_kind_once(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    (state_save_dir(cfg) / "job_state.new").mkdir()
    (state_save_dir(cfg) / "node_state.new").mkdir()
    assert release_saves(cfg) == ["job_state", "node_state"]
    assert release_saves(cfg) == []
    assert not list(state_save_dir(cfg).iterdir())


# --- what the restarted controller forgot ----------------------------------------------------


def _seen(drained: bool, jobs: dict[int, tuple[str, int, str]]) -> SlurmSeen:
    return SlurmSeen(
        at=T0, node_state="IDLE+DRAIN" if drained else "MIXED", node_drained=drained,
        jobs={
            j: JobSeen(job_id=j, state=s, restart_cnt=r, nodes=n) for j, (s, r, n) in jobs.items()
        },
    )  # fmt: skip


def test_a_forgotten_requeue_and_a_job_the_controller_lost_are_named() -> None:
    before = _seen(False, {7: ("RUNNING", 0, NODE), 8: ("RUNNING", 0, NODE)})
    writes = {"drain": _line(1, DRAIN), "requeue": _line(2, "Requeuing JobId=7")}
    after = _seen(True, {7: ("RUNNING", 0, NODE)})
    assert forgotten(before, writes, after, NODE) == [
        f"the requeue of job 7 (then Restarts=0, RUNNING on {NODE})",
        "job 8 (the controller no longer knows it)",
    ]
    kept = _seen(True, {7: ("PENDING", 1, ""), 8: ("PENDING", 1, "")})
    assert forgotten(before, writes, kept, NODE) == []


def test_a_write_after_the_last_save_was_forgotten_whatever_the_runbook_redid_since() -> None:
    """The runbook may redo a write before the restarted controller's first answer (its
    step retries as soon as slurmctld answers): the saved state tells."""
    resumed = {
        "drain": _line(1, DRAIN),
        "resume": _line(20, f"update_node: node {NODE} state set to IDLE"),
    }
    back = _seen(False, {})  # resumed again by the runbook before the first read
    saved = {"node_state": T0 + timedelta(seconds=9)}
    assert forgotten(None, resumed, back, NODE, saved) == [f"the resume of {NODE} (then MIXED)"]
    # Saved after it: kept. Saved in the same instant as it was logged: not known.
    for at in (21, 20.03):
        assert (
            forgotten(None, resumed, back, NODE, {"node_state": T0 + timedelta(seconds=at)}) == []
        )
    # Held: lost, whenever it was saved.
    before = _seen(True, {7: ("RUNNING", 0, NODE)})
    requeued = {"requeue": _line(2, "Requeuing JobId=7")}
    redone = _seen(True, {7: ("PENDING", 1, "")})
    assert forgotten(before, requeued, redone, NODE, {"job_state": T0}, held=["job_state"]) == [
        "the requeue of job 7 (then Restarts=1, PENDING)"
    ]


def test_a_forgotten_drain_or_resume_is_named() -> None:
    drain = {"drain": _line(1, DRAIN)}
    assert forgotten(None, drain, _seen(False, {}), NODE) == [f"the drain of {NODE} (then MIXED)"]
    resumed = {**drain, "resume": _line(9, f"update_node: node {NODE} state set to IDLE")}
    assert forgotten(None, resumed, _seen(True, {}), NODE) == [
        f"the resume of {NODE} (then IDLE+DRAIN)"
    ]
    assert forgotten(None, resumed, _seen(False, {}), NODE) == []


# --- the crash cases and their checks --------------------------------------------------------


def test_the_crash_cases_cover_each_write_the_requeue_step_and_the_repair() -> None:
    cases = crash_matrix()
    assert [c.moment for c in cases] == list(CRASH_MOMENTS)
    assert [(c.component, c.at) for c in cases] == [
        ("slurmctld", "drain"),
        ("slurmctld", "requeue"),
        ("slurmctld", "requeue"),
        ("slurmctld", "return_to_service"),
        ("slurmctld", "repair"),
    ]
    assert len({c.id for c in cases}) == len(cases)
    assert not any(c.holds_node for c in cases)  # a requeueable job: its requeue can be lost
    assert [c.moment for c in crash_matrix(["after:requeue"])] == ["after:requeue"]
    with pytest.raises(Exception, match="no crash case at wait_idle"):
        crash_matrix(["wait_idle"])


def _step(name: str, start_s: float) -> StepRecord:
    at = T0 + timedelta(seconds=start_s)
    return StepRecord(name=name, started_at=at, finished_at=at, outcome="ok")


def _report(**kw: object) -> OutageReport:
    """A crash case that went well: one reboot, its one cloud operation, the job requeued
    once, the node back in service."""
    outage = OutageDone(
        component="slurmctld", old_pid=1, new_pid=2, signal="SIGKILL", down_at=T0,
        up_at=T0 + timedelta(seconds=13), down_s=13,
    )  # fmt: skip
    reset = CloudOp(
        action="RESET", vm_id="vm-1", state="SUCCEEDED",
        started_at=T0 + timedelta(seconds=11), completed_at=T0 + timedelta(seconds=14),
    )  # fmt: skip
    return OutageReport.model_validate(
        {
            "incident_id": "inc-1",
            "node": NODE,
            "component": "slurmctld",
            "at": "repair",
            "for_s": 12,
            "status": "resolved",
            "opened_at": T0,
            "repairs": ["reboot"],
            "outage": outage,
            "cloud_ops": [reset],
            "job_id": 7,
            "job_restart_cnt": 1,
            "job_admin_comment": "autoclusters:requeue:inc-1:0",
            "steps": [_step("requeue", 1), _step("repair", 10), _step("return_to_service", 30)],
            **kw,
        }  # fmt: skip
    )


def test_a_job_on_the_returned_node_that_started_before_its_repair_is_a_ghost() -> None:
    case = OutageCase("slurmctld", "health_gate")
    ghost = JobOnNode(job_id=7, state="RUNNING", start_time=T0 - timedelta(seconds=60))
    later = JobOnNode(job_id=9, state="RUNNING", start_time=T0 + timedelta(seconds=31))
    assert ghost_jobs(_report(jobs_on_node=[ghost, later])) == [7]
    assert any("cannot be running: [7]" in p for p in problems(case, _report(jobs_on_node=[ghost])))
    assert problems(case, _report(jobs_on_node=[later])) == []
    # Left drained (failed): not returned, whatever runs there.
    failed = _report(status="failed", jobs_on_node=[ghost], node_drained=True)
    assert not any("cannot be running" in p for p in problems(case, failed))


def test_a_requeued_job_slurm_lost_must_be_reported() -> None:
    case = OutageCase("slurmctld", "health_gate")
    lost = _report(requeued_jobs=[7], requeued_unlisted=[7])
    assert "requeued jobs [7] no longer in Slurm and not reported as vanished" in problems(
        case, lost
    )
    assert (
        problems(case, _report(requeued_jobs=[7], requeued_unlisted=[7], vanished_jobs=[7])) == []
    )


def test_a_crash_case_must_have_crashed_the_controller() -> None:
    case = CrashCase("slurmctld", "repair", "repair")
    assert "slurmctld was not crashed (or not read after its restart)" in problems(case, _report())
    crash = CrashReport(moment="repair", node=NODE, for_s=12, after=SlurmSeen(at=T0))
    assert problems(case, _report(crash=crash)) == []


def test_a_write_case_crashes_within_a_second_and_must_forget_its_write() -> None:
    case = CrashCase("slurmctld", "requeue", "requeue")
    forgot = ["the requeue of job 7 (then Restarts=0, RUNNING on gpu-02)"]
    crash = CrashReport(
        moment="requeue", node=NODE, for_s=12, after=SlurmSeen(at=T0), lag_s=0.05, forgot=forgot
    )
    assert problems(case, _report(crash=crash)) == []
    late = crash.model_copy(update={"lag_s": 1.5})
    assert problems(case, _report(crash=late)) == [
        "SIGKILL 1.5s after the requeue, not within a second"
    ]
    kept = crash.model_copy(update={"forgot": []})
    assert problems(case, _report(crash=kept)) == [
        "the restarted controller forgot nothing, not the requeue of job"
    ]


# --- the jobs accounted for before a crash ----------------------------------------------


class _Sacct:
    """Slurm as it answers about the jobs' database index: sacct lists the jobs slurmdbd
    has a start for, job 7 from the third ask (`never`: not at all); slurmctld refuses an
    update of job 7 while it waits for its index, for its first `refusals` updates (None:
    always); and each save of everything, in order with the asks."""

    def __init__(self) -> None:
        self.asks = 0
        self.never = False
        self.refusals: int | None = 2
        self.calls: list[str] = []

    def slurm(self, cfg: SandboxConfig, *argv: str, timeout_s: float = 15) -> str:
        if argv[0] == "squeue":
            job = argv[-1]
            self.calls.append(f"squeue {job}")
            return json.dumps({"jobs": [{"job_id": int(job), "admin_comment": "ours:0"}]})
        if argv[0] == "scontrol":
            assert argv[1] == "update" and argv[3] == "AdminComment=ours:0"  # what it is
            self.calls.append(f"update {argv[2]}")
            if argv[2] == "JobId=7" and (self.refusals is None or self.refusals > 0):
                if self.refusals is not None:
                    self.refusals -= 1
                raise subprocess.CalledProcessError(
                    1, argv, stderr=f"Job update not available right now, {DB_INDEX_REFUSAL}"
                )
            return ""
        assert argv[0] == "sacct" and argv[-2:] == ("-j", "7,9")
        self.asks += 1
        self.calls.append("sacct")
        return "9\n7\n" if self.asks >= 3 and not self.never else "9\n"

    def save(self, cfg: SandboxConfig, timeout_s: float = 15) -> None:
        self.calls.append("save")


@pytest.fixture
def sacct(monkeypatch: pytest.MonkeyPatch) -> _Sacct:
    fake = _Sacct()
    monkeypatch.setattr(controller_crash, "_slurm", fake.slurm)
    monkeypatch.setattr(controller_crash, "save_now", fake.save)
    return fake


def test_a_crash_waits_for_its_jobs_database_index_then_saves(
    tmp_path: Path, sacct: _Sacct
) -> None:
    save_accounted(SandboxConfig(state_dir=tmp_path), [7, 9])
    # Saved only once slurmdbd had both and slurmctld took job 7's index from its answer
    # (an update of the job, to the AdminComment it has, refused twice meanwhile): the
    # saved state holds each job's index.
    probe = ["squeue 7", "update JobId=7"]
    assert sacct.calls == [
        "sacct", "sacct", "sacct", *probe * 3, "squeue 9", "update JobId=9", "save",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("never", "refusals", "error"),
    [
        (True, 2, "slurmdbd has no start of jobs 7,9"),  # never accounted for
        (False, None, "slurmctld has no DB index of job 7"),  # accounted, never indexed
    ],
)
def test_a_job_never_indexed_is_an_error_and_nothing_is_saved(
    tmp_path: Path, sacct: _Sacct, never: bool, refusals: int | None, error: str
) -> None:
    sacct.never, sacct.refusals = never, refusals
    with pytest.raises(CrashError, match=error):
        save_accounted(SandboxConfig(state_dir=tmp_path), [7, 9], timeout_s=0.5)
    assert "save" not in sacct.calls


def test_without_accounting_there_is_no_index_to_wait_for(tmp_path: Path, sacct: _Sacct) -> None:
    save_accounted(SandboxConfig(state_dir=tmp_path, accounting=False), [7, 9])
    save_accounted(SandboxConfig(state_dir=tmp_path), [])
    assert sacct.calls == []
