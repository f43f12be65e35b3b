"""The restart lag: from when a step could have completed (the component back, and what it
waited for done) to its completion in the history (sandbox/drivers/restart_lag.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoclusters.core.models import StepRecord
from autoclusters.sandbox.drivers.outage import CloudOp, OutageDone, OutageReport
from autoclusters.sandbox.drivers.outage_matrix import (
    TEMPORAL_RESTART_LAG_BOUND_S,
    OutageCase,
    problems,
)
from autoclusters.sandbox.drivers.restart_lag import ready_at, restart_lag_s

T0 = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def report(
    step: str, up_s: float = 12.0, completed_s: float | None = 20.0, **kw: object
) -> OutageReport:
    return OutageReport(
        incident_id="inc-1", node="gpu-01", component="temporal", at=step, for_s=12,
        status="resolved", opened_at=T0, steps=[StepRecord(name=step, started_at=at(-1))],
        outage=OutageDone(
            component="temporal", old_pid=1, new_pid=2, signal="SIGTERM",
            down_at=at(0), up_at=at(up_s), down_s=up_s,
        ),
        step_completed_at=at(completed_s) if completed_s is not None else None,
        **kw,
    )  # fmt: skip


def test_wait_idle_counts_from_the_later_of_the_server_back_and_the_job_ended() -> None:
    # The job ended 5 s after the server was back: the step could complete only then.
    r = report("wait_idle", up_s=12, completed_s=18.5, job_end_time=at(17))
    assert ready_at(r) == at(17)
    assert restart_lag_s(r) == 1.5
    # The job ended during the outage: the server's return is the moment.
    r = report("wait_idle", up_s=12, completed_s=22.0, job_end_time=at(5))
    assert restart_lag_s(r) == 10.0


def test_an_unknown_job_end_gives_no_figure_rather_than_one_from_the_server_alone() -> None:
    assert restart_lag_s(report("wait_idle", job_end_time=None)) is None


def test_repair_counts_from_the_last_cloud_operation_done() -> None:
    ops = [
        CloudOp(
            action="REBOOT", vm_id="vm", state="SUCCEEDED", started_at=at(s), completed_at=at(e)
        )
        for s, e in ((1, 14), (2, 16))
    ]
    r = report("repair", up_s=12, completed_s=16.8, cloud_ops=ops)
    assert ready_at(r) == at(16)
    assert abs((restart_lag_s(r) or 0) - 0.8) < 1e-9
    # No operation finished: unknown.
    pending = [CloudOp(action="REBOOT", vm_id="vm", state="IN_PROGRESS", started_at=at(1))]
    assert restart_lag_s(report("repair", cloud_ops=pending)) is None


def test_a_step_the_outage_missed_or_never_completed_has_no_lag() -> None:
    # Over before the server went away (it went at 0), or begun only after it was back (12).
    assert restart_lag_s(report("drain", completed_s=-0.5)) is None
    late = report("drain", completed_s=14.0)
    late.steps = [StepRecord(name="drain", started_at=at(13))]
    assert restart_lag_s(late) is None
    assert restart_lag_s(report("drain", completed_s=None)) is None
    never = report("drain").model_copy(update={"outage": None})
    assert ready_at(never) is None and restart_lag_s(never) is None
    # A step that waits on nothing else could complete as the server came back.
    lag = restart_lag_s(report("drain", up_s=12, completed_s=12.4))
    assert lag is not None and abs(lag - 0.4) < 1e-9


def test_a_step_whose_workflow_time_ended_before_the_outage_still_counts() -> None:
    # hit_step read False (the step's finished_at, workflow time, from before the outage),
    # but the history completed it after the server was back: it spanned the outage.
    r = report("wait_idle", up_s=12, completed_s=19.0, job_end_time=at(17))
    r.hit_step = False
    r.steps[0].finished_at = at(-0.5)
    assert restart_lag_s(r) == 2.0


def test_the_outage_matrix_flags_a_temporal_restart_that_stalls_its_step() -> None:
    case = OutageCase("temporal", "wait_idle")
    # The job ended at 17 s; the step completed 25 s later: a task lost with the server
    # waited out something longer than any of the runbook's timeouts.
    stalled = report("wait_idle", up_s=12, completed_s=17 + TEMPORAL_RESTART_LAG_BOUND_S + 5)
    stalled.job_end_time = at(17)
    assert any("a restart may add" in p for p in problems(case, stalled))
    prompt = report("wait_idle", up_s=12, completed_s=18.2, job_end_time=at(17))
    assert not any("a restart may add" in p for p in problems(case, prompt))
    # Another component's outage is not judged by Temporal's bound.
    other = OutageCase("slurmctld", "wait_idle")
    assert not any("a restart may add" in p for p in problems(other, stalled))
