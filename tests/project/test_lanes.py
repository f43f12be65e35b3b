"""The lanes are decided by what a test uses: no test that starts a server (a sandbox, or a
Temporal server through `env`) runs without the marker that keeps it out of `make unit`.
Checked over whatever this session collected and selected, so `make unit` checks itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from autoclusters.sandbox.runtime.config import PORT_SPAN
from tests.conftest import SERVER_FIXTURES, TORCH_DEFAULT_PORTS, port_slots

ROOT = Path(__file__).resolve().parents[2]


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


def test_make_test_leaves_out_only_the_scenario_lane_and_ci_runs_it() -> None:
    """`make test` runs every test but the `scenario` lane's; CI runs that lane after it, so
    no test leaves CI. Each scenario module's docstring says why it is not in `make test`
    (issue 20), and the demo itself, the chaos and the outage matrices are not scenarios."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    runs = [line for line in test_recipe.splitlines() if "$(BIN)/pytest" in line]
    assert [r for r in runs if "--collect-only" not in r] == [
        next(r for r in runs if '-m "not scenario"' in r)
    ], runs
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").split()
    assert ci.index("test") < ci.index("scenarios") and ci[ci.index("scenarios") - 1] == "make"
    scenarios = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if any(
            isinstance(n, ast.Attribute) and n.attr == "scenario"
            and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
            for n in ast.walk(tree)
        ):  # fmt: skip
            scenarios[path.stem] = " ".join((ast.get_docstring(tree) or "").split())
    assert set(scenarios) == {
        "test_sharing_demo", "test_sharing_borrow_demo", "test_demo_cmk",
        "test_controller_crash_on_sandbox", "test_silent_demo", "test_leaf_demo",
    }  # fmt: skip
    for stem, doc in scenarios.items():
        assert "`scenarios` lane" in doc and "not in `make test`" in doc, stem


@pytest.mark.integration
def test_groups_reach_xdist_in_a_parallel_run(tmp_path: Path) -> None:
    """Integration lane: it runs pytest with two xdist workers. `make test` runs one test at
    a time, where the check above skips; this runs it where it means something, over a
    module whose tests share a module fixture (one group)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q", "-rs",
         "-p", "no:cacheprovider", f"--basetemp={tmp_path}",
         "tests/project/test_lanes.py::test_groups_reach_xdist", "tests/core/test_policy.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]
    assert "SKIPPED" not in done.stdout  # the check ran under xdist, not skipped


@pytest.mark.parametrize("workers", [1, 7])
def test_no_sandbox_port_range_holds_a_port_torch_takes_without_asking(workers: int) -> None:
    """A sandbox whose range held 29500 (test_training's listener on torchrun's static port)
    lost an agent to "Address already in use" and its provisioning waited past its test's
    bound (ci15 of 2026-12-06)."""
    bases = [b for w in range(workers) for b in port_slots(w, workers, PORT_SPAN)]
    assert bases and len(bases) == len(set(bases))
    for port in TORCH_DEFAULT_PORTS:
        assert not [b for b in bases if b <= port < b + PORT_SPAN]
