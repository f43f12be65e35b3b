"""Hostlist expansion and the parsing of `sinfo --json` / `squeue --json`.

Aspects covered:
- hostlist expressions: ranges, lists, zero padding, several brackets, several items;
- Slurm 22.05 JSON: node state as a lower-case word plus `state_flags`, plain numbers;
- Slurm 23.02+ JSON: state as a list (`["IDLE", "DRAIN"]`), numbers wrapped as
  `{"set": true, "infinite": false, "number": n}`, job state as a list.
"""

from __future__ import annotations

from typing import Any

import pytest

from autoclusters.core.hostlist import expand
from autoclusters.integrations.slurm import parse_jobs, parse_nodes


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("gpu-01", ["gpu-01"]),
        ("gpu-[01-03]", ["gpu-01", "gpu-02", "gpu-03"]),
        ("gpu-[01-02,07]", ["gpu-01", "gpu-02", "gpu-07"]),
        ("gpu-[1,3]", ["gpu-1", "gpu-3"]),
        ("gpu-[8-10]", ["gpu-8", "gpu-9", "gpu-10"]),
        ("gpu-[098-101]", ["gpu-098", "gpu-099", "gpu-100", "gpu-101"]),
        ("gpu-[01-02],cpu-1", ["gpu-01", "gpu-02", "cpu-1"]),
        ("a-[1-2],b-[3,5]", ["a-1", "a-2", "b-3", "b-5"]),
        ("rack[1-2]-gpu[1-2]", ["rack1-gpu1", "rack1-gpu2", "rack2-gpu1", "rack2-gpu2"]),
        ("gpu[01-02]-ib", ["gpu01-ib", "gpu02-ib"]),
        (" gpu-01 ", ["gpu-01"]),
        ("", []),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


def test_expand_does_not_match_a_prefix_of_a_longer_name() -> None:
    # Jobs are matched to nodes by membership: gpu-1 must not match gpu-10's job.
    assert "gpu-1" not in expand("gpu-[10-11]")
    assert "gpu-01" in expand("gpu-[01-02]")


def _num(n: int) -> dict[str, Any]:
    return {"set": True, "infinite": False, "number": n}


SINFO_22_05: dict[str, Any] = {
    "meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"}},
    "errors": [],
    "nodes": [
        {
            "architecture": "x86_64",
            "cpus": 64,
            "gres": "gpu:8",
            "name": "gpu-01",
            "partitions": ["gpu"],
            "state": "idle",
            "state_flags": ["DRAIN"],
            "reason": "autoclusters: INC-7 XID_79",
            "reason_set_by_user": "root",
            "slurmd_start_time": 1767582000,
        },
        {
            "name": "gpu-02",
            "state": "down",
            "state_flags": ["NOT_RESPONDING"],
            "reason": "Not responding",
            "slurmd_start_time": 1767500000,
        },
        {
            "name": "gpu-03",
            "state": "mixed",
            "state_flags": [],
            "reason": "",
            "slurmd_start_time": 1767581000,
        },
    ],
}

SINFO_23_02: dict[str, Any] = {
    "meta": {"slurm": {"version": {"major": 23, "micro": 4, "minor": 2}, "release": "23.02.4"}},
    "errors": [],
    "warnings": [],
    "nodes": [
        {
            "name": "gpu-01",
            "state": ["IDLE", "DRAIN"],
            "reason": "autoclusters: INC-7 XID_79",
            "reason_changed_at": _num(1767582100),
            "slurmd_start_time": _num(1767582000),
            "gres": "gpu:8",
        },
        {
            "name": "gpu-02",
            "state": ["DOWN", "DRAIN", "NOT_RESPONDING"],
            "reason": "hca down",
            "slurmd_start_time": {"set": False, "infinite": False, "number": 0},
        },
        {
            "name": "gpu-03",
            "state": ["MIXED"],
            "reason": "",
            "slurmd_start_time": _num(1767581000),
        },
    ],
}


def test_parse_nodes_22_05() -> None:
    nodes = {n.name: n for n in parse_nodes(SINFO_22_05)}
    assert list(nodes) == ["gpu-01", "gpu-02", "gpu-03"]

    drained = nodes["gpu-01"]
    assert (drained.state, drained.state_flags) == ("idle", ["DRAIN"])
    assert drained.drained and drained.responding
    assert drained.reason == "autoclusters: INC-7 XID_79"
    assert drained.slurmd_start_time == 1767582000
    assert drained.display_state == "IDLE+DRAIN"

    down = nodes["gpu-02"]
    assert not down.drained and not down.responding
    assert down.display_state == "DOWN+NOT_RESPONDING"

    busy = nodes["gpu-03"]
    assert (busy.state, busy.state_flags, busy.reason) == ("mixed", [], "")
    assert busy.display_state == "MIXED"


def test_parse_nodes_23_02() -> None:
    nodes = {n.name: n for n in parse_nodes(SINFO_23_02)}

    drained = nodes["gpu-01"]
    assert (drained.state, drained.state_flags) == ("idle", ["DRAIN"])
    assert drained.drained and drained.responding
    assert drained.slurmd_start_time == 1767582000
    assert drained.display_state == "IDLE+DRAIN"

    down = nodes["gpu-02"]
    assert (down.state, down.state_flags) == ("down", ["DRAIN", "NOT_RESPONDING"])
    assert down.drained and not down.responding
    assert down.slurmd_start_time == 0

    busy = nodes["gpu-03"]
    assert (busy.state, busy.state_flags) == ("mixed", [])
    assert not busy.drained


def test_both_versions_parse_to_the_same_drained_node() -> None:
    old = next(n for n in parse_nodes(SINFO_22_05) if n.name == "gpu-01")
    new = next(n for n in parse_nodes(SINFO_23_02) if n.name == "gpu-01")
    assert old == new


def test_parse_nodes_tolerates_missing_fields() -> None:
    (node,) = parse_nodes({"nodes": [{"name": "gpu-09", "reason": None}]})
    assert (node.state, node.state_flags, node.reason, node.slurmd_start_time) == (
        "unknown",
        [],
        "",
        0,
    )
    assert not node.responding
    assert parse_nodes({"errors": []}) == []


SQUEUE_22_05: dict[str, Any] = {
    "errors": [],
    "jobs": [
        {
            "job_id": 101,
            "name": "train",
            "job_state": "RUNNING",
            "nodes": "gpu-[01-02]",
            "restart_cnt": 0,
            "state_reason": "None",
            "admin_comment": "",
            "requeue": True,
            "batch_flag": True,
        },
        {
            "job_id": 102,
            "name": "interactive",
            "job_state": "RUNNING",
            "nodes": "gpu-03",
            "restart_cnt": 0,
            "state_reason": "None",
            "requeue": False,
            "batch_flag": False,
        },
    ],
}

SQUEUE_23_02: dict[str, Any] = {
    "errors": [],
    "warnings": [],
    "jobs": [
        {
            "job_id": 101,
            "name": "train",
            "job_state": ["PENDING", "REQUEUED"],
            "nodes": "",
            "restart_cnt": _num(1),
            "state_reason": "BeginTime",
            "admin_comment": "autoclusters:requeue:INC-7:0",
            "requeue": True,
            "batch_flag": True,
        },
        {
            "job_id": 103,
            "name": "eval",
            "job_state": ["RUNNING"],
            "nodes": "gpu-[04,06]",
            "restart_cnt": 2,
            "state_reason": "None",
            "requeue": True,
        },
    ],
}


def test_parse_jobs_22_05() -> None:
    train, interactive = parse_jobs(SQUEUE_22_05)
    assert (train.job_id, train.name, train.job_state) == (101, "train", "RUNNING")
    assert expand(train.nodes) == ["gpu-01", "gpu-02"]
    assert (train.restart_cnt, train.requeue, train.batch_flag) == (0, True, True)
    assert train.admin_comment == ""
    assert (interactive.requeue, interactive.batch_flag) == (False, False)


def test_parse_jobs_23_02() -> None:
    requeued, running = parse_jobs(SQUEUE_23_02)
    assert requeued.job_state == "PENDING"
    assert (requeued.nodes, requeued.restart_cnt) == ("", 1)
    assert requeued.state_reason == "BeginTime"
    assert requeued.admin_comment == "autoclusters:requeue:INC-7:0"
    assert running.job_state == "RUNNING"
    assert running.restart_cnt == 2
    assert expand(running.nodes) == ["gpu-04", "gpu-06"]
    # A missing batch_flag is read as a batch job (the parser's default).
    assert running.batch_flag is True
