"""A sandbox a run left running is stopped at the end of the run, by its recorded PIDs
(tests/leftover_sandboxes.py); a stopped one, and anything not recorded, is left alone."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from autoclusters.core.process_start import start_ticks
from autoclusters.sandbox.runtime.processes import ProcessTable
from tests.leftover_sandboxes import stop_left_running


def running(pid: int) -> bool:
    """Alive and not a zombie (a stopped child of this process may wait to be reaped)."""
    return start_ticks(pid) is not None


def test_a_sandbox_left_running_is_stopped_and_nothing_else(tmp_path: Path) -> None:
    left = ProcessTable(tmp_path / "a" / "left")
    stopped_before = ProcessTable(tmp_path / "b" / "stopped")
    rec = left.spawn("worker", ["sleep", "300"])
    stopped_before.spawn("worker", ["sleep", "300"])
    stopped_before.stop("worker")  # its teardown ran: no record left
    unrecorded = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        assert left.alive("worker") and running(rec.pid)
        assert stop_left_running(tmp_path) == [tmp_path / "a" / "left"]
        assert not running(rec.pid) and left.records() == []
        assert running(unrecorded.pid)  # not the sandbox's: not ours to stop
        assert stop_left_running(tmp_path) == []  # nothing left the second time
    finally:
        unrecorded.kill()
        unrecorded.wait()


def test_a_record_of_this_very_process_is_never_signalled(tmp_path: Path) -> None:
    # What the hermetic-settings tests leave: a "running" sandbox whose Temporal is pytest.
    table = ProcessTable(tmp_path / "fake")
    table.dir.mkdir(parents=True)
    ticks = start_ticks(os.getpid())
    record = {"name": "temporal", "pid": os.getpid(), "start_ticks": ticks, "argv": [], "log": ""}
    (table.dir / "temporal.json").write_text(json.dumps(record))
    assert table.alive("temporal")
    assert stop_left_running(tmp_path) == []
    assert table.alive("temporal")  # still here: this test is still running
