"""The outage matrix's pure parts, without a sandbox: which names `sandbox outage` takes and
how it refuses others, which (component, step) pairs the matrix keeps and how it groups
them, and how a report is read (what the timeline shows, where the outage landed, which
cloud operations count)."""

from __future__ import annotations

import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoclusters.core.models import StepRecord
from autoclusters.sandbox import cluster
from autoclusters.sandbox.cli import sandbox_app
from autoclusters.sandbox.drivers import outage
from autoclusters.sandbox.drivers.chaos import STEPS
from autoclusters.sandbox.drivers.outage import (
    COMPONENTS,
    CloudOp,
    JobWatch,
    OutageDone,
    OutageError,
    OutageReport,
    _step_at,
    ops_cut_short,
    ops_under_job,
    process_name,
    shown_outages,
)
from autoclusters.sandbox.drivers.outage_matrix import (
    HOLD_PAST_OUTAGE_S,
    OutageCase,
    case_timeout_s,
    matrix,
    problems,
    skipped,
    waves,
)
from autoclusters.sandbox.runtime.config import SandboxConfig

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
# The pairs the matrix must keep (issue 19, item 5); every other pair is left out.
KEPT = {
    "slurmctld": {
        "drain", "requeue", "wait_idle", "wait_registered", "health_gate", "return_to_service",
    },
    "crusoe": {"repair", "wait_registered"},
    "k8s": {"wait_idle", "repair", "return_to_service"},
    "slack": {"drain", "repair"},
    "temporal": {"wait_idle", "repair"},
    "prometheus": {"wait_idle"},
    "alertmanager": {"wait_idle"},
    "api": {"wait_idle"},
}  # fmt: skip


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


# --- names -----------------------------------------------------------------------------------


def test_every_short_name_is_a_process_the_sandbox_records(tmp_path: Path) -> None:
    cfg = SandboxConfig(state_dir=tmp_path, k8s=True)
    started = set(cluster._order(cfg))  # what `sandbox up` starts, by process-table name
    assert set(COMPONENTS) == set(KEPT)
    for short, name in COMPONENTS.items():
        assert process_name(short) == name
        assert name in started, short
        assert process_name(name) == name  # the process-table name itself is taken too


def test_an_unknown_component_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(OutageError) as e:
        process_name("worker")  # restartable, but not an outage this matrix takes
    for short in COMPONENTS:
        assert short in str(e.value)


def test_the_verb_refuses_an_unknown_component_with_exit_2_before_any_sandbox(
    tmp_path: Path,
) -> None:
    r = CliRunner().invoke(
        sandbox_app, ["outage", "etcd", "--for", "5", "--state-dir", str(tmp_path / "none")]
    )
    assert r.exit_code == 2, r.output
    out = _flat(r.output)
    assert "'etcd' is not a component" in out, out
    assert ", ".join(COMPONENTS) in out, out


def test_the_verb_refuses_a_negative_duration(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        sandbox_app, ["outage", "slack", "--for", "-1", "--state-dir", str(tmp_path)]
    )
    assert r.exit_code == 2, r.output
    assert "--for must be 0 or more" in _flat(r.output)


def test_the_verb_needs_a_running_sandbox(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        sandbox_app, ["outage", "slack", "--for", "1", "--state-dir", str(tmp_path)]
    )
    assert r.exit_code == 1, r.output
    assert "outage failed" in _flat(r.output)


# --- the case table --------------------------------------------------------------------------


def test_the_matrix_keeps_the_steps_that_use_the_component_and_skips_the_rest() -> None:
    cases = matrix()
    assert {(c.component, c.at) for c in cases} == {
        (c, s) for c, steps in KEPT.items() for s in steps
    }
    assert len(cases) == 18
    for component in COMPONENTS:
        for step in STEPS:
            assert skipped(component, step) == (step not in KEPT[component]), (component, step)
    assert skipped("worker", "drain")  # not a component at all


def test_cases_come_in_component_then_runbook_order() -> None:
    cases = matrix()
    slurm = [c.at for c in cases if c.component == "slurmctld"]
    assert slurm == [s for s in STEPS if s in KEPT["slurmctld"]]
    assert [c.component for c in cases][:1] == ["slurmctld"]
    assert len({c.id for c in cases}) == len(cases)


def test_early_steps_hold_the_node_with_a_job_that_outlasts_the_outage() -> None:
    for case in matrix():
        assert case.holds_node == (case.at in ("drain", "requeue", "wait_idle")), case
    held = OutageCase("slurmctld", "wait_idle")
    assert held.hold_s(15) == 15 + HOLD_PAST_OUTAGE_S  # wait_idle waits through the outage
    assert held.hold_s(60) == 60 + HOLD_PAST_OUTAGE_S
    # Where the next step is the point, the job ends while the component is still away.
    assert OutageCase("k8s", "wait_idle").hold_s(15) < 15
    assert OutageCase("slack", "drain").hold_s(60) < 15
    assert case_timeout_s(60) > case_timeout_s(15) > 15 + HOLD_PAST_OUTAGE_S + 60


@pytest.mark.parametrize(
    ("only", "ids"),
    [
        (["crusoe"], ["crusoe@repair", "crusoe@wait_registered"]),
        (["@repair"], ["k8s@repair", "crusoe@repair", "slack@repair", "temporal@repair"]),
        (["slack@drain", "api"], ["slack@drain", "api@wait_idle"]),
    ],
)
def test_a_filter_picks_cases_by_component_step_or_id(only: list[str], ids: list[str]) -> None:
    assert [c.id for c in matrix(only)] == ids


def test_a_filter_that_matches_nothing_is_refused() -> None:
    with pytest.raises(OutageError, match="slack@health_gate"):
        matrix(["slack@health_gate"])


def test_only_outages_that_reach_no_incident_share_a_wave() -> None:
    cases = matrix()
    grouped = waves(cases)
    assert [c for w in grouped for c in w] == cases  # each case once, order kept
    together = [w for w in grouped if len(w) > 1]
    assert [[c.id for c in w] for w in together] == [
        ["prometheus@wait_idle", "alertmanager@wait_idle"]
    ]
    assert all(len(w) == 1 for w in waves(cases, width=1))


# --- reading a report ------------------------------------------------------------------------


def _step(name: str, start_s: float, end_s: float | None, detail: str = "") -> StepRecord:
    return StepRecord(
        name=name,
        started_at=T0 + timedelta(seconds=start_s),
        finished_at=None if end_s is None else T0 + timedelta(seconds=end_s),
        outcome="ok",
        detail=detail,
    )


def _report(ops: list[CloudOp], component: str = "crusoe-emulator", **kw: object) -> OutageReport:
    outage = OutageDone(
        component=component, old_pid=1, new_pid=2, signal="SIGTERM", down_at=T0,
        up_at=T0 + timedelta(seconds=15), down_s=15,
    )  # fmt: skip
    return OutageReport.model_validate(
        {
            "incident_id": "inc-1",
            "node": "gpu-01",
            "component": "crusoe",
            "at": "repair",
            "for_s": 15,
            "status": "resolved",
            "outage": outage,
            "cloud_ops": ops,
            "opened_at": T0,
            **kw,
        }  # fmt: skip
    )


def _op(state: str, start_s: float, end_s: float | None) -> CloudOp:
    return CloudOp(
        action="RESET", vm_id="vm-1", state=state,
        started_at=T0 + timedelta(seconds=start_s),
        completed_at=None if end_s is None else T0 + timedelta(seconds=end_s),
    )  # fmt: skip


def test_the_timeline_shows_the_outage_and_the_longest_is_kept() -> None:
    steps = [
        _step("drain", 0, 1),
        _step("requeue", 1, 15, "requeued [4]; slurmctld unreachable for 14 s"),
        _step("wait_idle", 15, 30, "idle after 2s; slurmctld unavailable (retrying) for 3.5s"),
        _step("repair", 30, 33, "reboot: vm-1 -> vm-1"),
    ]
    shown, longest = shown_outages(steps)
    assert shown == [
        "requeue: requeued [4]; slurmctld unreachable for 14 s",
        "wait_idle: idle after 2s; slurmctld unavailable (retrying) for 3.5s",
    ]
    assert longest == 14
    assert shown_outages([_step("repair", 0, 1, "reboot: a -> a")]) == ([], None)


def test_where_the_outage_landed_is_read_from_the_poll_log() -> None:
    log = [(T0 + timedelta(seconds=s), step) for s, step in [(0, "drain"), (1, "requeue")]]
    log.append((T0 + timedelta(seconds=20), "wait_idle"))  # a gap: Temporal was away
    assert _step_at(log, T0 + timedelta(seconds=0.5), after=False) == "drain"
    assert _step_at(log, T0 + timedelta(seconds=5), after=True) == "wait_idle"
    assert _step_at(log, T0 + timedelta(seconds=30), after=True) == "wait_idle"
    assert _step_at([], T0, after=True) is None


def test_an_operation_the_crusoe_outage_cut_short_is_set_apart() -> None:
    aborted = _op("FAILED", 1, 14)  # failed by the emulator's stop
    later = _op("FAILED", 20, 25)  # failed on its own, after the outage
    ok = _op("SUCCEEDED", 16, 19)
    assert ops_cut_short(_report([aborted, ok, later])) == [aborted]
    # Only the Crusoe emulator's own outage explains a failed operation.
    assert ops_cut_short(_report([aborted, ok], component="slurmctld")) == []


def test_an_operation_under_a_running_job_is_caught() -> None:
    job_end = T0 + timedelta(seconds=10)
    early, late = _op("SUCCEEDED", 9.5, 12), _op("SUCCEEDED", 10.2, 13)
    assert ops_under_job(_report([early, late], job_end_time=job_end)) == [early]
    seen = T0 + timedelta(seconds=11)  # the harness still saw it running at 11 s
    assert ops_under_job(_report([early, late], job_last_running_at=seen)) == [early, late]
    assert ops_under_job(_report([late])) == []
    # Requeued, back on the node after its repair and ended there: Slurm's end time is that
    # second stint's; the first stint's end (the watch's) is what the repair must follow.
    requeued = _report([early, late], job_end_time=job_end + timedelta(minutes=5))
    requeued.job_restart_cnt = 1
    assert ops_under_job(requeued) == []
    requeued.job_last_running_at = seen
    assert ops_under_job(requeued) == [early, late]


def _resolved(**kw: object) -> OutageReport:
    steps = [_step("requeue", 1, 2, "requeued [7]"), _step("repair", 5, 8, "reboot: a -> a")]
    fields: dict[str, object] = {
        "repairs": ["reboot"], "steps": steps, "job_id": 7, "job_state": "PENDING",
        "job_restart_cnt": 1, "job_admin_comment": "autoclusters:requeue:inc-1:0",
        "node_state": "IDLE", "k8s_cordoned": False,
    }  # fmt: skip
    return _report([_op("SUCCEEDED", 5, 7)], "crusoe-emulator", **(fields | kw))


def test_a_case_that_rode_the_outage_out_has_no_problems() -> None:
    case = OutageCase("crusoe", "repair")
    assert problems(case, _resolved()) == []
    # The Crusoe API's outage failed the first RESET: the repair had to ask again.
    report = _resolved(cloud_ops=[_op("FAILED", 1, 14), _op("SUCCEEDED", 16, 19)])
    assert problems(case, report) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"status": "failed"}, "incident failed, not resolved"),
        ({"outage": None}, "crusoe was never taken away"),
        ({"repairs": ["reboot", "replace"]}, "not one reboot"),
        ({"job_restart_cnt": 2}, "job restarts 2, not 1"),
        ({"job_admin_comment": ""}, "job AdminComment ''"),
        ({"node_drained": True, "node_state": "IDLE+DRAIN"}, "resolved, yet left IDLE+DRAIN"),
        ({"k8s_cordoned": True}, "left cordoned in Kubernetes"),
        (
            {"job_last_running_at": T0 + timedelta(seconds=6)},
            "cloud operation under the running job",
        ),
        (
            {"job_restart_cnt": 0, "job_end_time": T0 + timedelta(seconds=6)},
            "under the running job",
        ),
    ],
)
def test_each_broken_promise_is_named(change: dict[str, object], problem: str) -> None:
    found = problems(OutageCase("crusoe", "repair"), _resolved(**change))
    assert any(problem in p for p in found), found


def test_a_second_cloud_operation_is_a_problem_unless_the_outage_cut_the_first_short() -> None:
    twice = _resolved(cloud_ops=[_op("SUCCEEDED", 5, 7), _op("SUCCEEDED", 20, 22)])
    assert any("cloud operations" in p for p in problems(OutageCase("k8s", "repair"), twice))
    slurm_case = _resolved(cloud_ops=[_op("FAILED", 1, 14), _op("SUCCEEDED", 16, 19)])
    slurm_case.outage = slurm_case.outage.model_copy(update={"component": "slurmctld"})  # type: ignore[union-attr]
    assert any("cloud operations" in p for p in problems(OutageCase("k8s", "repair"), slurm_case))


def test_a_held_job_must_end_by_itself_and_be_seen_by_the_requeue() -> None:
    case = OutageCase("slurmctld", "requeue")
    seen = _step("requeue", 1, 2, "requeued no jobs; cannot requeue [7]")
    waited = _step("wait_idle", 2, 31, "idle after 29s")
    held: dict[str, object] = {
        "job_state": "COMPLETED", "job_restart_cnt": 0, "job_admin_comment": "",
        "job_end_time": T0 + timedelta(seconds=30), "steps": [seen, waited],
        "cloud_ops": [_op("SUCCEEDED", 32, 35)],
    }  # fmt: skip
    assert problems(case, _resolved(**held)) == []
    blind = held | {"steps": [_step("requeue", 1, 2, "requeued no jobs"), waited]}
    assert any("requeue did not see" in p for p in problems(case, _resolved(**blind)))
    early = held | {"steps": [seen, _step("wait_idle", 2, 5, "idle after 3s")]}
    assert any("wait_idle ended" in p for p in problems(case, _resolved(**early)))
    cancelled = held | {"job_state": "CANCELLED"}
    assert any("not run to its end" in p for p in problems(case, _resolved(**cancelled)))


async def _watch(
    monkeypatch: pytest.MonkeyPatch,
    reads: list[dict[str, object] | None],
    first_restart_cnt: int | None = None,
) -> tuple[JobWatch, list[datetime]]:
    """A JobWatch of job 3 on gpu-02 over `reads` (None: squeue failed, slurmctld away),
    and when each read began."""
    left = list(reads)
    read_at: list[datetime] = []

    def squeue_job(cfg: SandboxConfig, job_id: int, timeout_s: float) -> dict[str, object] | None:
        read_at.append(datetime.now(UTC))
        read = left.pop(0)
        if read is None:
            raise subprocess.TimeoutExpired("squeue", timeout_s)
        return read or None  # {}: not listed

    monkeypatch.setattr(outage, "squeue_job", squeue_job)
    watch = JobWatch(SandboxConfig(), 3, "gpu-02", first_restart_cnt)
    await watch.run(every_s=0)
    assert not left
    return watch, read_at


def _job(restarts: int, nodes: str, state: str = "RUNNING") -> dict[str, object]:
    return {"job_id": 3, "job_state": [state], "nodes": nodes, "restart_cnt": restarts}


async def test_the_job_watch_ends_the_first_stint_at_a_requeue_it_did_not_see(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """squeue blind from the requeue until the job runs on the node again (a loaded machine,
    slurmctld away): that second stint is not the first, so it does not move the time the
    job was last seen running there (a cloud operation between the two is not under it)."""
    watch, read_at = await _watch(
        monkeypatch, [_job(0, "gpu-[01-02]"), _job(0, "gpu-[01-02]"), None, None,
                      _job(1, "gpu-[02-03]")],
    )  # fmt: skip
    # Last seen running at the second read, stamped when it was asked (its answer may come
    # seconds later on a loaded machine), off the node at the fifth (the later stint).
    assert watch.last_running_at is not None and watch.off_node_at is not None
    assert read_at[0] <= watch.last_running_at <= read_at[1]
    assert watch.off_node_at >= read_at[4]
    # The same read-outs with the requeue seen: off the node at the PENDING read.
    seen, read_at = await _watch(
        monkeypatch, [_job(0, "gpu-[01-02]"), None, _job(1, "", "PENDING")],
    )  # fmt: skip
    assert seen.off_node_at is not None and seen.off_node_at >= read_at[2]


async def test_a_watch_that_never_saw_the_first_stint_does_not_take_the_second_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ci4 of 2026-12-06 (`k8s@return_to_service`): every read came after the runbook's
    requeue (the job completing, then pending), and the first that saw it running on the
    node was its run there after the node's return, 22 s after the reboot, which the case
    then reported as a cloud operation under the running job. With the restart count read
    before the incident, that run is a later stint: the job left the node unseen."""
    reads: list[dict[str, object] | None] = [
        None, _job(0, "gpu-02", "COMPLETING"), _job(1, "", "PENDING"),
    ]  # fmt: skip
    watch, read_at = await _watch(monkeypatch, reads, first_restart_cnt=0)
    assert watch.last_running_at is None
    assert watch.off_node_at is not None and watch.off_node_at >= read_at[2]
    # Without it (the old watch), the run after the return was taken for the first stint:
    # last seen running there at the fourth read, until the job was gone.
    blind, read_at = await _watch(monkeypatch, [*reads, _job(1, "gpu-02"), {}])
    assert blind.last_running_at is not None and read_at[2] < blind.last_running_at <= read_at[3]
