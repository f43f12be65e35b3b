"""The lanes are decided by what a test uses: no test that starts a server (a sandbox, or a
Temporal server through `env`) runs without the marker that keeps it out of `make unit`.
Checked over whatever this session collected and selected, so `make unit` checks itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ALONE_TURNS, SERVER_FIXTURES, xdist_group

ROOT = Path(__file__).resolve().parents[1]


def test_every_selected_test_that_starts_a_server_is_marked(request: pytest.FixtureRequest) -> None:
    unmarked = []
    for item in request.session.items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture in used & SERVER_FIXTURES.keys():
            if not (item.get_closest_marker("workflow") or item.get_closest_marker("integration")):
                unmarked.append(f"{item.nodeid} uses {fixture}")
    assert unmarked == []


def test_the_rule_marks_what_a_module_would_miss(request: pytest.FixtureRequest) -> None:
    # A workflow test that reaches the server through the shared fixture (no import of the
    # time-skipping helper in its module: the case the old rule missed) is marked.
    ours = [i for i in request.session.items if "test_remediation_workflow.py" in i.nodeid]
    if not ours:
        pytest.skip("test_remediation_workflow not selected in this session")
    assert all(i.get_closest_marker("workflow") for i in ours if "env" in i.fixturenames)


def test_groups_reach_xdist(request: pytest.FixtureRequest) -> None:
    """Under `--dist loadgroup` every grouped test's node id carries its group: that is
    what xdist schedules by. (pytest 9.2 stopped reading the attribute xdist sets, and
    every group silently fell apart: pyproject.toml pins below it.)"""
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not an xdist worker with --dist loadgroup")
    lost = []
    for item in request.session.items:
        mark = item.get_closest_marker("xdist_group")
        if mark and not item.nodeid.endswith(f"@{mark.args[0]}"):
            lost.append(item.nodeid)
    assert lost == []


def test_the_alone_tests_run_in_as_many_turns_as_make_test_has_workers(
    request: pytest.FixtureRequest,
) -> None:
    """`make test` runs the `alone` tests with one xdist worker per turn: a turn with no
    worker would wait for another's, one worker too many would start idle. Every `alone`
    test this run selected is in its module's turn."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    turns = sorted(set(ALONE_TURNS.values()))
    assert turns == list(range(len(turns)))
    assert f"-n {len(turns)} $(XDIST) -m alone" in makefile
    for item in request.session.items:  # whatever this run selected of them
        if item.get_closest_marker("alone"):
            stem = Path(item.nodeid.split("::", 1)[0]).stem
            assert stem in ALONE_TURNS, f"{item.nodeid}: alone, but in no turn"
            assert xdist_group(item) == f"alone-{ALONE_TURNS[stem]}"


@pytest.mark.integration
def test_groups_reach_xdist_in_a_parallel_run(tmp_path: Path) -> None:
    """Integration lane: it runs pytest with two xdist workers. `make test` runs one test at
    a time, where the check above skips; this runs it where it means something, over a
    module whose tests share a module fixture (one group)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-rs",
         "-p", "no:cacheprovider", f"--basetemp={tmp_path}",
         "tests/test_lanes.py::test_groups_reach_xdist", "tests/test_policy.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert "SKIPPED" not in done.stdout  # the check ran under xdist, not skipped
