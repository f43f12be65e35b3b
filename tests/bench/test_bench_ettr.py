"""bench/ettr.py's reading of a job's log, on made-up lines (the bench needs a sandbox: its
figures are in docs/recovery.md)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from autoclusters.sandbox.machines.joblog import ProgressLine

BENCH = Path(__file__).resolve().parents[2] / "bench"


sys.path.insert(0, str(BENCH))  # ettr imports mttr beside it
ettr = importlib.import_module("ettr")


def _line(
    ts: float, step: int, restart: int = 0, elastic: int = 0, node: str = "a"
) -> ProgressLine:
    return ProgressLine(ts=ts, node=node, restart=restart, step=step, elastic=elastic)


def test_steps_done_again_after_a_requeue_count_once_and_gaps_are_not_training() -> None:
    # Run 0: steps 1-8 a second apart (both ranks log each); requeued at 8, resumed from
    # the checkpoint at 5: run 1 does 6-8 again from t=20, then 9-10.
    lines = [_line(float(s), s, node=n) for s in range(1, 9) for n in ("a", "b")]
    lines += [_line(20.0 + i, s, restart=1) for i, s in enumerate(range(6, 11))]
    spent, kept, done, period = ettr.kept_time(lines)
    assert period == 1.0
    assert kept == 10  # 1-5 of run 0, 6-10 of run 1
    assert done == 13  # 6-8 twice
    # Steps 2-5 and 7-10 a second each; 1 and 6 begin a run: the median step time.
    assert spent == pytest.approx(10.0)


def test_a_re_formed_group_goes_on_from_memory_and_loses_nothing() -> None:
    lines = [_line(float(s), s) for s in range(1, 6)]
    lines += [_line(9.0 + s, s, elastic=1) for s in range(6, 9)]  # 4 s without a step
    spent, kept, done, _ = ettr.kept_time(lines)
    assert (kept, done) == (8, 8)
    assert spent == pytest.approx(8.0)


def test_a_run_cut_off_before_it_caught_up_keeps_only_its_own_steps() -> None:
    lines = [_line(float(s), s) for s in range(1, 11)]
    lines += [_line(30.0, 6, restart=1), _line(31.0, 7, restart=1)]  # ended at 7
    spent, kept, _, _ = ettr.kept_time(lines)
    assert kept == 7  # 8-10 of run 0 were thrown away by the restart
    assert spent == pytest.approx(7.0)


def test_faults_take_their_kinds_realistic_effect_unless_named() -> None:
    assert ettr.parse_faults("XID_79,ECC_DBE:hang") == [("XID_79", "hang"), ("ECC_DBE", "hang")]
    assert [e for _, e in ettr.parse_faults(ettr.DEFAULT_FAULTS)] == ["hang", "crash", "lost"]


def test_the_tail_is_the_largest_below_20_values() -> None:
    mttr = sys.modules["mttr"]
    assert mttr.stats([1.0, 2.0, 9.0])["p95"] == 9.0 and mttr.tail_name(3) == "max of 3"
    vals = [float(v) for v in range(1, 41)]
    assert mttr.stats(vals)["p95"] == 38.0 and mttr.tail_name(40) == "p95"
