"""bench/silent.py's summary and table on made-up trials (the bench itself needs a sandbox:
its figures are in docs/detection.md)."""

from __future__ import annotations

from typing import Any

from autoclusters.sandbox.machines.joblog import ProgressLine
from tests.helpers import load_bench

silent = load_bench("silent")


def _hang(detect: float, again: float | None, named: str = "gpu-03", **kw: Any) -> dict[str, Any]:
    return {
        "kind": "hang", "node": "gpu-03", "named": named, "other_nodes_named": [],
        "fault": "JOB_HANG", "expected_fault": "JOB_HANG", "status": "resolved",
        "hang -> incident": detect, "hang -> job stepping again": again, **kw,
    }  # fmt: skip


def _slow(detect: float, again: float) -> dict[str, Any]:
    return {
        "kind": "slow", "node": "gpu-03", "named": "gpu-03", "other_nodes_named": [],
        "fault": "SLOW_NODE", "expected_fault": "SLOW_NODE", "status": "resolved",
        "straggler -> SLOW_NODE": detect, "straggler -> full speed": again,
    }  # fmt: skip


def test_the_tail_is_the_max_of_n_under_twenty_and_each_target_is_judged_on_it() -> None:
    rows = [_hang(26.0, 28.0), _hang(27.0, 29.0), _hang(31.0, 33.0), _slow(22.0, 39.0)]
    s = silent.summarise(rows, None)
    hang = s["hang -> incident"]
    assert (hang["median"], hang["p95"], hang["n"]) == (27.0, 31.0, 3)
    assert hang["met"] is False  # 31 s > 30 s
    assert s["hang -> job stepping again"]["met"] is True
    assert s["straggler -> SLOW_NODE"]["met"] is True
    assert s["right node"] == {"hang": "3/3", "slow": "1/1"}
    assert s["wrong nodes named"] == 0
    assert "healthy run incidents" not in s
    text = silent.table(s, None)
    assert "max of 3" in text and "NO" in text


def test_a_trial_not_reached_fails_its_target_and_a_wrong_node_is_counted() -> None:
    rows = [
        _hang(26.0, None),
        _hang(25.5, 27.0, named="gpu-01", other_nodes_named=["gpu-03"]),
        _slow(22.0, 39.0),
    ]
    s = silent.summarise(rows, {"incidents": ["gpu-02"]})
    again = s["hang -> job stepping again"]
    assert again["n"] == 1 and again["missing"] == 1 and again["met"] is False
    assert s["right node"]["hang"] == "1/2"
    assert s["wrong nodes named"] == 2  # the wrong node named, and the other one beside
    assert s["healthy run incidents"] == 1
    assert s["straggler -> full speed"]["n"] == 1


def test_a_fault_never_found_is_a_miss_not_a_wrong_node() -> None:
    """A trial whose fault opened no incident (the bench's row for it) fails the detection
    target as not reached, and names no node."""
    missed = {
        "kind": "slow", "node": "gpu-02", "named": None, "other_nodes_named": [], "fault": None,
        "expected_fault": "SLOW_NODE", "status": "not opened", "recovery_path": None,
        "straggler -> SLOW_NODE": None, "straggler -> full speed": None,
    }  # fmt: skip
    s = silent.summarise([_slow(22.0, 39.0), missed], None)
    found = s["straggler -> SLOW_NODE"]
    assert found["n"] == 1 and found["missing"] == 1 and found["met"] is False
    assert s["right node"]["slow"] == "1/2" and s["wrong nodes named"] == 0
    assert s["resolved"] == "1/2"


def test_the_longest_gaps_show_the_healthy_runs_evaluation_and_stall() -> None:
    lines = [
        ProgressLine(ts=t, node="gpu-01", restart=0, step=i)
        for i, t in enumerate([0.0, 1.0, 2.0, 42.0, 43.0, 64.0, 65.0], start=1)
    ]
    assert silent.longest_gaps(lines, 2) == [40.0, 21.0]
