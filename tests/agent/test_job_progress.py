"""Silent faults from the jobs' progress (issue 40): the rank's module, the agent's read, its
metrics, and the rules that name a hung job's culprit (JOB_HANG) or a straggler
(SLOW_NODE), with the pauses that must not be either. In-process, time injected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from autoclusters.clients.agent import progress_series as ps
from autoclusters.clients.agent.agent import Agent
from autoclusters.clients.agent.metrics import AgentMetrics
from autoclusters.clients.agent.progress_rules import (
    JOB_HANG,
    PROGRESS_KINDS,
    SLOW_NODE,
    ProgressThresholds,
    evaluate,
    findings_for,
    hang_threshold,
    quantile,
)
from autoclusters.clients.agent.settings import AgentSettings
from autoclusters.core.faults import NAMED_FAULTS
from autoclusters.core.job_progress import ENV_DIR, JobProgress, RankProgress, read_progress
from autoclusters.core.node_report import ReportState
from autoclusters.core.policy import Rung, default_policy
from tests.agent.test_agent_faults import T0, Clock
from tests.fakes.systems import ReportSink

TH = ProgressThresholds()
ROOT = Path(__file__).resolve().parents[2]


def writer(tmp: Path, clock: Clock, rank: int, node: str, **kw: Any) -> JobProgress:
    args: dict[str, Any] = dict(job="4242", world=4, restart=0, heartbeat=False)
    return JobProgress(
        tmp, rank=rank, node=node, clock=clock, monotonic=clock, **(args | kw), env={}
    )


# --- the module the ranks call ------------------------------------------------------------


def test_without_a_directory_nothing_is_written(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    p = JobProgress(env={"SLURM_JOB_ID": "7"})
    assert not p.enabled and p.path is None
    with p.collective("all_reduce"), p.paused("checkpoint"):
        p.step()
    p.beat()
    p.close()
    assert list(tmp_path.iterdir()) == []


def test_identity_from_slurm_and_torchrun_environment(tmp_path: Path) -> None:
    env = {
        ENV_DIR: str(tmp_path), "SLURM_JOB_ID": "91", "SLURM_RESTART_COUNT": "2",
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "SLURMD_NODENAME": "gpu-03",
    }  # fmt: skip
    p = JobProgress(env=env, heartbeat=False)
    assert (p.job, p.restart, p.rank, p.world, p.local_rank, p.node) == (
        "91", 2, 5, 8, 1, "gpu-03",
    )  # fmt: skip
    assert p.path == tmp_path / "91" / "rank-5.json"
    slurm = JobProgress(env={ENV_DIR: str(tmp_path), "SLURM_PROCID": "3", "SLURM_NTASKS": "4"})
    assert (slurm.rank, slurm.world, slurm.job) == (3, 4, "local")


def test_steps_write_atomically_at_most_every_interval(tmp_path: Path) -> None:
    clock = Clock()
    p = writer(tmp_path, clock, 1, "gpu-02", min_interval_s=1.0, window=4)
    p.step(10)  # the first step: no time (it spans the start)
    assert p.writes == 1
    for step in range(11, 20):
        clock.advance(0.25)
        with p.collective("all_reduce"):
            clock.advance(0.05)
        p.step(step)
    assert p.writes == 3  # at 10, after 1 s, after 2 s: not one per step
    [r] = read_progress(tmp_path)
    assert (r.job, r.rank, r.node, r.world, r.restart) == ("4242", 1, "gpu-02", 4, 0)
    assert r.step == 18 and r.collectives == 8 and not r.in_collective
    assert r.step_time_s == pytest.approx(0.3) and r.busy_s == pytest.approx(0.25)
    assert [s for s, _t, _b in r.recent] == [15, 16, 17, 18]  # the window's last 4
    assert r.written_at == pytest.approx(T0 + 8 * 0.3)
    assert sorted(x.name for x in (tmp_path / "4242").iterdir()) == ["rank-1.json"]  # no tmp


def test_collective_state_and_heartbeat(tmp_path: Path) -> None:
    clock = Clock()
    p = writer(tmp_path, clock, 0, "gpu-01", heartbeat_s=5.0)
    p.step(1)
    p.collective_begin("all_reduce")
    clock.advance(3)
    p.beat()  # not due yet
    assert read_progress(tmp_path)[0].collective_since is None
    clock.advance(3)
    p.beat()  # the heartbeat writes the state as it is: inside since T0
    [r] = read_progress(tmp_path)
    assert (r.collective, r.collective_since, r.written_at) == ("all_reduce", T0, T0 + 6)
    p.collective_end()
    p.collective_end()  # unbalanced: ignored


def test_declared_pause_is_written_at_once_and_not_busy(tmp_path: Path) -> None:
    clock = Clock()
    p = writer(tmp_path, clock, 0, "gpu-01")
    p.step(1)
    clock.advance(0.1)
    with p.paused("checkpoint"):
        assert read_progress(tmp_path)[0].pause == "checkpoint"
        clock.advance(40)
    assert read_progress(tmp_path)[0].pause is None
    clock.advance(1.0)
    p.step(2)
    [r] = read_progress(tmp_path)
    assert r.step_time_s == pytest.approx(41.1) and r.busy_s == pytest.approx(1.1)


def test_regroup_moves_the_file_and_close_removes_it(tmp_path: Path) -> None:
    clock = Clock()
    p = writer(tmp_path, clock, 2, "gpu-03")
    p.step(5)
    p.regroup(rank=1, world=2, generation=1)
    assert read_progress(tmp_path) == []
    clock.advance(30)  # the re-forming: not a step time
    p.step(6)
    [r] = read_progress(tmp_path)
    assert (r.rank, r.world, r.generation, r.step_time_s, r.recent) == (1, 2, 1, None, ())
    p.close()
    assert read_progress(tmp_path) == []


def test_a_failing_write_never_raises(tmp_path: Path) -> None:
    (tmp_path / "4242").write_text("a file where the job's directory goes")
    p = writer(tmp_path, Clock(), 0, "gpu-01")
    p.step(1)
    p.step(2)
    assert p.write_errors == 2 and p.writes == 0


def test_the_agent_skips_what_is_not_a_rank_file(tmp_path: Path) -> None:
    clock = Clock()
    writer(tmp_path, clock, 0, "gpu-01").step(1)
    job = tmp_path / "4242"
    (job / "rank-1.json").write_text("{not json")
    (job / "rank-2.json").write_text(json.dumps({"v": 99, "job": "x"}))
    (job / "rank-3.json").write_text(
        json.dumps({"v": 1, "job": "4242", "rank": "3", "node": "n", "written_at": T0})
    )
    (job / "rank-4.json").write_text(" " * 70_000)
    (job / ".rank-5.json.1.tmp").write_text("{}")
    (job / "notes.txt").write_text("hello")
    bad = {"v": 1, "job": "4242", "rank": 6, "node": "n", "written_at": T0,
           "step_time_s": float("nan"), "recent": [[1, -2, 0], [2, 1.0, 0.5], "x"]}  # fmt: skip
    (job / "rank-6.json").write_text(json.dumps(bad))
    (tmp_path / "stray.json").write_text("{}")
    got = read_progress(tmp_path)
    assert [r.rank for r in got] == [0, 6]
    assert got[1].step_time_s is None and got[1].recent == ((2, 1.0, 0.5),)
    assert read_progress(tmp_path / "missing") == []


def test_the_example_job_imports_this_very_file() -> None:
    link = ROOT / "examples" / "training" / "job_progress.py"
    assert link.resolve() == (ROOT / "core" / "job_progress.py").resolve()
    text = (ROOT / "core" / "job_progress.py").read_text()
    imports = [x for x in text.splitlines() if x.startswith(("import ", "from "))]
    assert not [x for x in imports if "autoclusters" in x], imports  # stdlib only


# --- the rules ----------------------------------------------------------------------------


def rank(
    r: int,
    node: str,
    *,
    step: int = 100,
    stepped_at: float = T0,
    written_at: float | None = None,
    inside: bool = False,
    collectives: int | None = None,
    times: float = 1.0,
    busy: float | None = None,
    pause: str | None = None,
    restart: int = 0,
    pid: int | None = None,
    floor: float | None = None,
) -> RankProgress:
    b = times if busy is None else busy
    return RankProgress(
        job="4242", rank=r, node=node, written_at=stepped_at if written_at is None else written_at,
        restart=restart, world=4, pid=pid, step=step, stepped_at=stepped_at, step_time_s=times,
        busy_s=b, collectives=step if collectives is None else collectives,
        collective="all_reduce" if inside else None,
        collective_since=stepped_at + 0.5 if inside else None, pause=pause,
        pause_since=stepped_at if pause else None,
        recent=tuple((s, times, b) for s in range(step - 31, step + 1)), hang_floor_s=floor,
    )  # fmt: skip


NODES = ["gpu-01", "gpu-01", "gpu-02", "gpu-02"]


def reported(ranks: list[RankProgress], now: float, th: ProgressThresholds = TH) -> dict[str, Any]:
    """Node -> its findings' subjects, for each node that has one."""
    v = evaluate(ranks, now, th)
    out = {}
    for node in sorted({r.node for r in ranks}):
        if found := findings_for(node, v, th):
            out[node] = {k: f.subjects for k, f in found.items()}
    return out


def test_the_threshold_follows_the_jobs_own_step_time_tail() -> None:
    assert quantile([1.0] * 19 + [9.0], 0.95) == 1.0 and quantile([], 0.95) is None
    assert quantile([1.0] * 18 + [9.0, 9.0], 0.95) == 9.0
    fast = [rank(i, n, times=1.0) for i, n in enumerate(NODES)]
    slow = [rank(i, n, times=10.0) for i, n in enumerate(NODES)]
    assert hang_threshold(fast, TH) == (25.0, 1.0)  # the floor
    assert hang_threshold(slow, TH) == (50.0, 10.0)  # k x the tail
    declared = [rank(i, n, floor=120.0) for i, n in enumerate(NODES)]
    assert hang_threshold(declared, TH)[0] == 120.0  # the job's own floor
    # The same 30 s without a step: a hang at 1 s steps, nothing yet at 10 s steps.
    stuck = [rank(i, n, inside=i != 3, written_at=T0 + 29) for i, n in enumerate(NODES)]
    assert set(reported(stuck, T0 + 30)) == {"gpu-02"}
    stuck_slow = [
        rank(i, n, inside=i != 3, times=10.0, written_at=T0 + 50) for i, n in enumerate(NODES)
    ]
    assert reported(stuck_slow, T0 + 30) == {}
    assert set(reported(stuck_slow, T0 + 51)) == {"gpu-02"}


def test_a_frozen_rank_is_named_by_its_heartbeat() -> None:
    now = T0 + 40
    ranks = [rank(i, n, inside=True, written_at=now - 2) for i, n in enumerate(NODES)]
    ranks[1] = rank(1, "gpu-01", inside=True, written_at=T0)  # SIGSTOPped: no more writes
    got = reported(ranks, now)
    assert list(got) == ["gpu-01"]
    [subject] = got["gpu-01"][JOB_HANG]
    assert (subject["rank"], subject["rule"], subject["node"]) == (1, "heartbeat", "gpu-01")
    assert subject["stalled_s"] == 40 and subject["threshold_s"] == 25
    assert subject["heartbeat_age_s"] == 40 and subject["others"]["heartbeat_age_s"] == 2


def test_the_rank_outside_the_collective_is_named() -> None:
    now = T0 + 26
    ranks = [rank(i, n, inside=i != 2, written_at=now - 1) for i, n in enumerate(NODES)]
    got = reported(ranks, now)
    [subject] = got["gpu-02"][JOB_HANG]
    assert (subject["rank"], subject["rule"], subject["in_collective"]) == (
        2, "not_in_collective", False,
    )  # fmt: skip
    assert subject["others"]["in_collective"] == 3
    assert list(got) == ["gpu-02"]
    f = findings_for("gpu-02", evaluate(ranks, now, TH), TH)[JOB_HANG]
    assert f.immediate and "rank 2 on gpu-02" in f.message and "4242" in f.message


def test_the_rank_behind_the_others_count_is_named() -> None:
    now = T0 + 60
    ranks = [rank(i, n, inside=True, collectives=201, written_at=now) for i, n in enumerate(NODES)]
    ranks[0] = rank(0, "gpu-01", inside=True, collectives=200, written_at=now)
    got = reported(ranks, now)
    assert list(got) == ["gpu-01"]
    assert [(s["rank"], s["rule"]) for s in got["gpu-01"][JOB_HANG]] == [(0, "behind")]


def test_a_node_local_view_names_a_rank_among_its_node() -> None:
    """Eight ranks on a node, the directory node-local: its agent sees only them."""
    now = T0 + 30
    mine = [rank(i, "gpu-05", inside=i != 6, written_at=now) for i in range(8)]
    assert [s["rank"] for s in reported(mine, now)["gpu-05"][JOB_HANG]] == [6]
    victims = [rank(i, "gpu-06", inside=True, written_at=now) for i in range(8, 16)]
    assert reported(victims, now) == {}  # all inside, waiting: not this node


@pytest.mark.parametrize(
    "case",
    ["all-outside", "all-inside", "declared-checkpoint", "one-rank-saving-declared"],
)
def test_a_pause_of_the_whole_job_is_no_hang(case: str) -> None:
    now = T0 + 300  # an evaluation or a save, far past the threshold
    if case == "all-outside":
        ranks = [rank(i, n, written_at=now) for i, n in enumerate(NODES)]
    elif case == "all-inside":
        ranks = [rank(i, n, inside=True, written_at=now) for i, n in enumerate(NODES)]
    elif case == "declared-checkpoint":
        ranks = [rank(i, n, pause="checkpoint", written_at=now) for i, n in enumerate(NODES)]
    else:  # rank 0 saves alone, the others wait in the next collective
        ranks = [rank(i, n, inside=i != 0, written_at=now) for i, n in enumerate(NODES)]
        ranks[0] = rank(0, "gpu-01", pause="checkpoint", written_at=now)
    v = evaluate(ranks, now, TH)
    assert reported(ranks, now) == {}
    if case in ("all-outside", "all-inside"):
        [stall] = v.stalls  # seen (the metrics show it), nobody named
        assert stall.culprits == () and stall.rule is None


def test_a_pause_declared_too_long_ago_excuses_nothing() -> None:
    now = T0 + 2000
    ranks = [rank(i, n, inside=i != 0, written_at=now) for i, n in enumerate(NODES)]
    ranks[0] = rank(0, "gpu-01", pause="checkpoint", written_at=now)
    assert list(reported(ranks, now)) == ["gpu-01"]


def test_a_20s_data_loader_stall_on_one_step_is_no_hang() -> None:
    # Rank 3 loads its batch for 20 s; the others wait in the all-reduce: 21 s without a step.
    ranks = [rank(i, n, inside=i != 3, written_at=T0 + 21) for i, n in enumerate(NODES)]
    assert reported(ranks, T0 + 21) == {}
    # Then it steps: every rank's window holds one 21 s step among 1 s ones.
    after = [rank(i, n, step=101, stepped_at=T0 + 21) for i, n in enumerate(NODES)]
    after = [
        RankProgress(**{**r.__dict__, "recent": (*r.recent[1:-1], (101, 21.0, 1.0))}) for r in after
    ]
    assert hang_threshold(after, TH)[0] == 25.0  # one slow step is not the tail
    assert reported(after, T0 + 22) == {}
    assert evaluate(after, T0 + 22, TH).slow == []


def test_older_runs_forgotten_files_and_ended_ranks_are_not_judged() -> None:
    now = T0 + 100
    old = [rank(i, n, restart=0, inside=i != 1, written_at=now) for i, n in enumerate(NODES)]
    new = [rank(i, n, restart=1, stepped_at=now - 1, written_at=now) for i, n in enumerate(NODES)]
    assert reported(old + new, now) == {}  # the requeued run steps
    forgotten = [rank(i, n, written_at=T0) for i, n in enumerate(NODES)]
    assert evaluate(forgotten, T0 + 3601, TH).ranks == []
    ended = [rank(i, n, pid=100 + i, inside=i != 1, written_at=now) for i, n in enumerate(NODES)]
    v = evaluate(ended, now, TH, gone=lambda r: r.pid == 101)
    assert v.stalls[0].culprits == ()  # the rank that ended is not the one it waits for


def straggling(ratio: float, slow_steps: int, *, now: float = T0) -> list[RankProgress]:
    """Four ranks on two nodes at 1 s; gpu-02's busy time x `ratio` on its last steps."""
    ranks = []
    for i, node in enumerate(NODES):
        recent = []
        for s in range(69, 101):
            late = node == "gpu-02" and s > 100 - slow_steps
            recent.append((s, ratio if slow_steps else 1.0, ratio if late else 1.0))
        ranks.append(
            RankProgress(
                job="4242",
                rank=i,
                node=node,
                written_at=now,
                step=100,
                stepped_at=now,
                recent=tuple(recent),
            )  # fmt: skip
        )
    return ranks


def test_a_straggler_node_is_named_after_slow_window_steps() -> None:
    got = reported(straggling(2.0, 10), T0 + 1)
    assert list(got) == ["gpu-02"]
    [subject] = got["gpu-02"][SLOW_NODE]
    assert subject["ranks"] == [2, 3] and subject["ratio"] == 2.0
    assert subject["steps"] == list(range(91, 101)) and subject["peers_busy_s"] == [1.0] * 10
    f = findings_for("gpu-02", evaluate(straggling(2.0, 10), T0 + 1, TH), TH)[SLOW_NODE]
    assert f.immediate and "gpu-02" in f.message


def test_no_straggler_below_the_window_or_the_ratio() -> None:
    assert reported(straggling(2.0, 9), T0 + 1) == {}
    assert reported(straggling(1.3, 32), T0 + 1) == {}
    assert reported(straggling(1.0, 0), T0 + 1) == {}
    # A job that stopped stepping is the hang rule's, not a straggler.
    assert evaluate(straggling(2.0, 32), T0 + 100, TH).slow == []
    # One node alone: no other node to compare with.
    alone = [r for r in straggling(2.0, 32) if r.node == "gpu-02"]
    assert evaluate(alone, T0 + 1, TH).slow == []


# --- the catalogue and the policy -------------------------------------------------------


def test_the_kinds_are_in_the_catalogue_and_the_default_policy() -> None:
    assert set(PROGRESS_KINDS) <= NAMED_FAULTS
    p = default_policy()
    hang, slow = p.rule_for(JOB_HANG), p.rule_for(SLOW_NODE)
    assert (hang.severity, hang.first_rung, hang.on_degraded) == (
        "critical", Rung.RESET_GPU, "drain",
    )  # fmt: skip
    assert (slow.severity, slow.first_rung, slow.on_degraded) == (
        "warning", Rung.RESET_GPU, "checkpoint_then_drain",
    )  # fmt: skip


# --- the agent: metrics and reports ------------------------------------------------------


def test_metrics_per_rank_of_this_node(tmp_path: Path) -> None:
    now = T0 + 30
    ranks = [rank(i, n, inside=i != 3, written_at=now - 2) for i, n in enumerate(NODES)]
    m = AgentMetrics("gpu-02")
    m.observe_progress(now, ranks, {"4242": 25.0})
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(m.text())
        for s in fam.samples
        if s.name.startswith("autoclusters_job_")
    }
    labels = (("Hostname", "gpu-02"), ("job_id", "4242"), ("rank", "2"))
    assert samples[(ps.LAST_STEP, labels)] == 100
    assert samples[(ps.STEP_SECONDS, labels)] == 1.0
    assert samples[(ps.BUSY_SECONDS, labels)] == 1.0
    assert samples[(ps.SINCE_STEP, labels)] == 30
    assert samples[(ps.COLLECTIVE_SINCE, labels)] == T0 + 0.5
    assert samples[(ps.HEARTBEAT_AGE, labels)] == 2
    rank3 = (("Hostname", "gpu-02"), ("job_id", "4242"), ("rank", "3"))
    assert samples[(ps.COLLECTIVE_SINCE, rank3)] == 0  # not inside
    job = (("Hostname", "gpu-02"), ("job_id", "4242"))
    assert samples[(ps.HANG_THRESHOLD, job)] == 25
    assert {dict(k[1])["rank"] for k in samples if k[0] == ps.LAST_STEP} == {"2", "3"}
    assert not [k for k in samples if {"job", "node"} & dict(k[1]).keys()]


def agent(tmp: Path, clock: Clock, node: str, **kw: Any) -> tuple[Agent, ReportSink]:
    sink = ReportSink()
    settings = AgentSettings(
        progress_dir=tmp, hold_checks=3, clear_checks=2, metrics_port=0, **kw
    )  # fmt: skip
    a = Agent(
        node=node, settings=settings, backend=None, infiniband=None, sink=sink, clock=clock,
        alive=lambda pid: True,
    )  # fmt: skip
    return a, sink


def test_the_agent_reports_the_hang_on_the_culprits_node_once_and_resolves(
    tmp_path: Path,
) -> None:
    clock = Clock()
    ranks = [writer(tmp_path, clock, i, n) for i, n in enumerate(NODES)]
    hung, other = agent(tmp_path, clock, "gpu-02"), agent(tmp_path, clock, "gpu-01")
    for step in range(1, 40):
        clock.advance(1.0)
        for p in ranks:
            p.step(step)
    assert hung[0].check().reports == [] and other[0].check().reports == []
    # Rank 3 stops (frozen in its data loader); the others enter the all-reduce and wait.
    for p in ranks[:3]:
        p.collective_begin("all_reduce")
    for _ in range(12):  # 24 s: below the floor, nothing
        clock.advance(2.0)
        for p in ranks[:3]:
            p.beat()
        assert hung[0].check_progress().reports == []
    clock.advance(2.0)
    for p in ranks[:3]:
        p.beat()
    [report] = hung[0].check_progress().reports
    assert (report.node, report.fault, report.state) == ("gpu-02", JOB_HANG, ReportState.FIRING)
    [subject] = report.evidence["subjects"]
    assert (subject["rank"], subject["rule"]) == (3, "heartbeat")
    assert other[0].check_progress().reports == []  # its ranks wait inside: victims
    clock.advance(2.0)
    assert hung[0].check_progress().reports == []  # debounced: once
    assert "autoclusters_job_seconds_since_step" in (hung[0].metrics or AgentMetrics("x")).text()
    # The job is recovered: the frozen rank's process is gone, the others step again.
    ranks[3].close()
    for p in ranks[:3]:
        p.collective_end()
    for _ in range(2):
        clock.advance(10.0)
        for p in ranks[:3]:
            p.step()
        got = hung[0].check().reports
    assert [(r.fault, r.state) for r in got] == [(JOB_HANG, ReportState.RESOLVED)]


def test_the_agent_reports_a_slow_node_from_its_periodic_check(tmp_path: Path) -> None:
    clock = Clock()
    ranks = [writer(tmp_path, clock, i, n) for i, n in enumerate(NODES)]
    slow, fast = agent(tmp_path, clock, "gpu-02"), agent(tmp_path, clock, "gpu-01")
    for step in range(1, 30):
        clock.advance(1.0)  # every rank computes
        for p in ranks[:2]:
            p.collective_begin("all_reduce")
        if step > 15:  # gpu-02 computes twice as long; gpu-01's ranks wait for it inside
            clock.advance(1.0)
        for p in ranks[2:]:
            p.collective_begin("all_reduce")
        clock.advance(0.01)
        for p in ranks:
            p.collective_end()
            p.step(step)
        if step in (20, 24):  # 9 slow steps at most: nothing yet
            assert slow[0].check().reports == [] and fast[0].check().reports == []
    [report] = slow[0].check().reports
    assert (report.fault, report.state) == (SLOW_NODE, ReportState.FIRING)
    assert report.evidence["subjects"][0]["ranks"] == [2, 3]
    assert fast[0].check().reports == []
