"""A hung job's stacks in its JOB_HANG evidence (issue 40; clients/agent/stacks.py).

Aspects:
- grouping: identical stacks grouped, largest first; the smallest group is the outlier (on
  a tie, the culprit's); failed dumps listed apart; the groups bounded;
- py-spy's JSON read to the main thread's frames;
- no py-spy: the evidence says so, the report goes out as before;
- with py-spy installed (skipped otherwise): real Python processes, two waiting in one
  function and one in another, dumped and grouped, the odd one named, also while it is
  stopped (SIGSTOP); through the agent's judge, once per stall.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoclusters.clients.agent import stacks
from autoclusters.clients.agent.job_verdicts import JobVerdicts
from autoclusters.clients.agent.progress_rules import JOB_HANG, ProgressThresholds
from autoclusters.clients.agent.stacks import RankStack, group_stacks, main_frames
from autoclusters.sandbox.runtime.processes import wait_until
from tests.agent.test_agent_faults import T0
from tests.agent.test_job_progress import NODES, rank

WAIT = ("wait (dist.py:10)", "all_reduce (train.py:40)", "<module> (train.py:90)")
LOAD = ("read (loader.py:7)", "next_batch (train.py:30)", "<module> (train.py:88)")


def test_identical_stacks_grouped_and_the_outlier_named() -> None:
    got = group_stacks(
        [RankStack(0, 10, WAIT), RankStack(1, 11, WAIT), RankStack(2, 12, LOAD),
         RankStack(3, 13, error="Permission denied")],
        culprits=[2],
    )  # fmt: skip
    assert got["groups"] == [
        {"ranks": [0, 1], "frames": list(WAIT)},
        {"ranks": [2], "frames": list(LOAD)},
    ]
    assert got["outlier_ranks"] == [2] and got["failed"] == {"3": "Permission denied"}
    # One group: nobody stands out.
    assert group_stacks([RankStack(0, 10, WAIT), RankStack(1, 11, WAIT)])["outlier_ranks"] is None
    # A tie: the group with the culprit.
    tie = group_stacks([RankStack(0, 10, WAIT), RankStack(1, 11, LOAD)], culprits=[0])
    assert tie["outlier_ranks"] == [0]


def test_the_groups_are_bounded_and_keep_the_outlier() -> None:
    many = [RankStack(i, 100 + i, (f"f{i % 6} (x.py:1)",)) for i in range(6 * 3)]
    many.append(RankStack(99, 199, ("odd (x.py:2)",)))
    got = group_stacks(many, culprits=[99])
    assert len(got["groups"]) == stacks.MAX_GROUPS and got["groups_left_out"] == 3
    assert got["groups"][-1]["ranks"] == [99] and got["outlier_ranks"] == [99]


def test_py_spys_json_to_the_main_threads_frames() -> None:
    dump = [
        {"thread_name": "pt_heartbeat", "frames": [{"name": "beat", "short_filename": "h.py",
                                                    "line": 3}]},
        {"thread_name": "MainThread", "frames": [
            {"name": "wait", "filename": "/x/dist.py", "short_filename": "dist.py", "line": 10},
            {"name": "all_reduce", "short_filename": "train.py", "line": 40},
        ]},
    ]  # fmt: skip
    assert main_frames(dump) == ("wait (dist.py:10)", "all_reduce (train.py:40)")
    assert main_frames({"not": "a list"}) == () and main_frames([]) == ()


def _hung_ranks(pids: dict[int, int]) -> list:  # type: ignore[type-arg]
    """Rank 3 frozen (its heartbeat stopped), the others inside the all-reduce: 40 s."""
    now = T0 + 40
    ranks = [
        rank(i, n, inside=True, written_at=now - 2, pid=pids.get(i)) for i, n in enumerate(NODES)
    ]
    ranks[3] = rank(3, "gpu-02", inside=True, written_at=T0, pid=pids.get(3))
    return ranks


def test_without_py_spy_the_evidence_says_so() -> None:
    judge = JobVerdicts("gpu-02", ProgressThresholds(), [], py_spy=None)
    _v, found = judge.judge(_hung_ranks({2: 12, 3: 13}), T0 + 40)
    [subject] = found[JOB_HANG].subjects
    assert subject["rank"] == 3
    assert subject["stacks"] == {
        "tool": "py-spy",
        "detail": "py-spy is not installed on this node: no stacks",
    }
    off = JobVerdicts("gpu-02", ProgressThresholds(), [], py_spy="py-spy", stack_dumps=False)
    assert "stacks" not in off.judge(_hung_ranks({}), T0 + 40)[1][JOB_HANG].subjects[0]


# --- with py-spy, on real processes -------------------------------------------------------

PY_SPY = stacks.find_py_spy("py-spy")
needs_py_spy = pytest.mark.skipif(PY_SPY is None, reason="py-spy is not installed here")

WAITER = """
import sys, time
def all_reduce():
    print("ready", flush=True)
    time.sleep(600)
def data_loader():
    print("ready", flush=True)
    time.sleep(600)
{fn}()
"""


@pytest.fixture
def ranks_running(tmp_path: Path) -> Iterator[dict[int, int]]:
    """Rank -> pid: ranks 2 and 3 on "gpu-02"; rank 2 in all_reduce, rank 3 in data_loader."""
    procs: dict[int, subprocess.Popen[str]] = {}
    try:
        for r, fn in ((2, "all_reduce"), (3, "data_loader")):
            script = tmp_path / f"rank{r}.py"
            script.write_text(WAITER.format(fn=fn))
            procs[r] = subprocess.Popen(
                [sys.executable, str(script)], stdout=subprocess.PIPE, text=True
            )
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield {r: p.pid for r, p in procs.items()}
    finally:
        for p in procs.values():  # ours, by their own handles
            p.kill()
            p.wait()


@needs_py_spy
def test_real_stacks_grouped_with_the_frozen_rank_named(ranks_running: dict[int, int]) -> None:
    assert PY_SPY is not None
    # A second waiter in all_reduce would make a group of two; here each is alone, so
    # the culprit decides the tie, and the frames say where each one waits.
    got = stacks.stacks_evidence(PY_SPY, ranks_running, culprits=[3])
    assert got["failed"] == {}, got
    frames = {g["ranks"][0]: g["frames"] for g in got["groups"]}
    assert frames[2][0].startswith("all_reduce (rank2.py:")
    assert frames[3][0].startswith("data_loader (rank3.py:")
    assert got["outlier_ranks"] == [3]


@needs_py_spy
def test_a_stopped_rank_is_dumped_too(ranks_running: dict[int, int]) -> None:
    """SIGSTOP is how the sandbox freezes a rank: --nonblocking reads it all the same."""
    assert PY_SPY is not None
    pid = ranks_running[3]
    subprocess.run(["kill", "-STOP", str(pid)], check=True)
    try:
        # A guard against a hang, not a speed: the kernel shows the stop within a tick.
        stopped = wait_until(
            lambda: Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "T", 10, 0.05
        )
        assert stopped, "the rank never showed stopped"
        [dumped] = stacks.dump_stacks(PY_SPY, {3: pid})
        assert dumped.error is None and dumped.frames[0].startswith("data_loader")
    finally:
        subprocess.run(["kill", f"-{signal.SIGCONT.name.removeprefix('SIG')}", str(pid)])


@needs_py_spy
def test_the_agents_judge_dumps_once_per_stall(ranks_running: dict[int, int]) -> None:
    judge = JobVerdicts("gpu-02", ProgressThresholds(), [], py_spy=PY_SPY)
    ranks = _hung_ranks(ranks_running)
    first = judge.judge(ranks, T0 + 40)[1][JOB_HANG].subjects[0]["stacks"]
    assert first["outlier_ranks"] == [3] and len(first["groups"]) == 2
    # Two seconds later, the same stall: the same dump, not a second one.
    again = judge.judge(ranks, T0 + 42)[1][JOB_HANG].subjects[0]["stacks"]
    assert again is first
