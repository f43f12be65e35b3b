"""bench/mttr.py's readings and report, and bench/recovery_plot.py's table and plot, on
made-up figures (the bench itself needs a sandbox: its figures are in docs/recovery.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoclusters.sandbox.machines.joblog import event_at
from tests.helpers import load_bench

mttr = load_bench("mttr")
plot = load_bench("recovery_plot")

LOG = """\
ts=100.0 node=gpu-01 restart=0 event=launch job=2 nodes=gpu-[01-02] rdzv=127.0.0.1:1
ts=104.5 node=gpu-01 restart=0 event=resumed ckpt_step=0 load_s=0.010
ts=105.0 node=gpu-01 restart=0 step=1 rank=0 resumed_from=0 loss=0.5
ts=120.0 node=gpu-01 restart=1 event=launch job=2 nodes=gpu-[01,03] rdzv=127.0.0.1:1
garbage ts=x restart=1 event=resumed
ts=126.25 node=gpu-03 restart=1 event=resumed ckpt_step=5 load_s=0.020
"""


def test_event_at_reads_each_runs_own_event(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text(LOG)
    assert event_at(log, "launch", 0) == 100.0
    assert event_at(log, "launch", 1) == 120.0
    # The malformed line is skipped, not read as the event.
    assert event_at(log, "resumed", 1) == 126.25
    # Not yet logged, and a log not there: unknown, not a time.
    assert event_at(log, "launch", 2) is None
    assert event_at(tmp_path / "none.log", "launch", 0) is None


def test_report_takes_median_p95_and_n_over_the_faults_that_reached_a_phase(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        {"detection": 0.1, "job running again": 10.0, "requests failed": None},
        {"detection": 0.3, "job running again": 12.0, "checkpoint loaded": 9.0},
        {"detection": 0.2, "job running again": 30.0, "checkpoint loaded": 8.0},
    ]
    summary = mttr.report(rows, [0.05, 0.07, 0.06], None)
    assert summary["job running again"] == {"median": 12.0, "p95": 30.0, "n": 3}
    assert summary["checkpoint loaded"]["n"] == 2
    assert "requests failed" not in summary  # no fault measured it: no figure, not 0
    out = capsys.readouterr().out
    assert "job running again" in out and "effective training" not in out


def test_report_sums_inference_requests_of_the_borrowed_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        {"job running again": 20.0, "requests sent": 700, "requests failed": 0},
        {"job running again": 22.0, "requests sent": 650, "requests failed": 2},
    ]
    summary = mttr.report(rows, [], None)
    assert summary["requests failed"] == {"median": 1.0, "p95": 2, "n": 2}
    assert "1350 sent, 2 failed" in capsys.readouterr().out


def _record(path: str, backs: list[float]) -> dict[str, object]:
    rows = [{"job running again": b, "detection": 0.05} for b in backs]
    return {
        "path": path,
        "command": f"bench/mttr.py --job-recovery {path}",
        "date": "2026-12-02T12:00:00+00:00",
        "machine": {"cpus": 2, "load_before": [0.5, 0.5, 0.5], "load_after": [1, 1, 1]},
        "job": "torchrun",
        "rows": rows,
        "summary": {
            "job running again": {
                "median": sorted(backs)[len(backs) // 2],
                "p95": max(backs),
                "n": len(backs),
            },
            "detection": {"median": 0.05, "p95": 0.05, "n": len(backs)},
        },
    }


def test_the_table_sets_the_paths_side_by_side_with_their_targets() -> None:
    table = plot.markdown([_record("requeue", [10.0, 11.5, 12.0]), _record("in-job", [1.0])])
    lines = table.splitlines()
    assert lines[0] == "| seconds from the fault | requeue | in-job |"
    back = next(ln for ln in lines if "job running again" in ln)
    assert back.endswith("| 11.50 / 12 (3) | 1 / 1 (1) |")
    assert "borrowed node lent" not in table  # no path measured it: no row
    assert lines[-1].startswith("| target (issue 22) | median ≤ 11 s")


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    files = []
    for path, backs in [("requeue", [10.0, 12.0]), ("borrowed", [20.0, 25.0])]:
        f = tmp_path / f"{path}.json"
        f.write_text(json.dumps(_record(path, backs)))
        files.append(f)
    out = plot.plot(plot.load(files), tmp_path / "paths.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


CTLD = """\
[2026-12-02T11:49:31.593] sched: Allocate JobId=2 NodeList=gpu-[01-02] #CPUs=2 Partition=gpu
[2026-12-02T11:50:01.000] Requeuing JobId=21
[2026-12-02T11:50:03.003] Requeuing JobId=2
[2026-12-02T11:50:04.100] sched: Allocate JobId=21 NodeList=gpu-04 #CPUs=2 Partition=gpu
[2026-12-02T11:50:05.890] sched: Allocate JobId=2 NodeList=gpu-[01,03] #CPUs=2 Partition=gpu
[2026-12-02T11:51:00.000] Requeuing JobId=2
"""


def test_slurmctld_restart_reads_this_jobs_requeue_and_next_allocation(tmp_path: Path) -> None:
    log = tmp_path / "slurmctld.log"
    log.write_text(CTLD)
    after = mttr.datetime.fromisoformat("2026-12-02T11:49:55").timestamp()
    got = mttr.slurmctld_restart(log, 2, after)
    assert got["allocated"] - got["ended"] == pytest.approx(2.887)
    assert got["ended"] - after == pytest.approx(8.003)
    # Only requeued so far: no allocation yet; no log: nothing known.
    log.write_text(CTLD.splitlines()[2] + "\n")
    assert set(mttr.slurmctld_restart(log, 2, after)) == {"ended"}
    assert mttr.slurmctld_restart(tmp_path / "none.log", 2, after) == {}
