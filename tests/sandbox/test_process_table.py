"""The sandbox's ProcessTable under concurrent spawners (the CLI, the Crusoe emulator's
machines and the emulated Slinky kubelet share one table): no process it starts can run
unrecorded, so `sandbox down` (which stops what is recorded) leaves nothing behind.

A leak once seen: the emulator's power_off of a machine (stop: SIGTERM, wait, forget the
record) overlapped the kubelet starting that machine's slurmd again; the stop then removed
the new slurmd's record, and that slurmd outlived `sandbox down`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoclusters.core.process_start import command_line, start_ticks
from autoclusters.sandbox.runtime import processes
from autoclusters.sandbox.runtime.processes import (
    ProcessRecord,
    ProcessTable,
    referencing,
    stop_referencing,
    wait_until,
)

SLEEPER = [sys.executable, "-c", "import time; time.sleep(300)"]


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    """A state dir; whatever still names it when the test ends is stopped by its PID (a
    failing test must not leak either), after the test's own checks."""
    state = tmp_path / "state"
    state.mkdir()
    yield state
    assert stop_referencing(state) == []


def test_a_stop_never_forgets_a_process_started_meanwhile(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = ProcessTable(state)
    old = table.spawn("slurmd-gpu-03", SLEEPER)
    real_exited = processes._exited
    spawner: list[threading.Thread] = []

    def exited(rec: ProcessRecord) -> bool:
        done = real_exited(rec)
        if done and rec.pid == old.pid and not spawner:
            # The old process is gone and the stop has yet to forget it: another spawner
            # (the kubelet) sees the name not running and starts it again, now.
            t = threading.Thread(target=table.spawn, args=("slurmd-gpu-03", SLEEPER))
            spawner.append(t)
            t.start()
            t.join(0.5)  # it may finish first (it did, before the lock)
        return done

    monkeypatch.setattr(processes, "_exited", exited)
    assert table.stop("slurmd-gpu-03")
    spawner[0].join(10)
    assert not spawner[0].is_alive()
    new = table.get("slurmd-gpu-03")
    assert new is not None and new.pid != old.pid and table.alive("slurmd-gpu-03")
    # What runs under the sandbox's state dir is exactly what the table records.
    assert [pid for pid, _ in referencing(state)] == [new.pid]
    assert table.stop("slurmd-gpu-03")
    assert referencing(state) == []


def test_a_daemon_runs_only_once_it_is_recorded(state: Path) -> None:
    """A spawner that dies between starting the process and writing its record (the
    operator stopped by `sandbox down` mid-pass) leaves no daemon running."""
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from autoclusters.sandbox.runtime.processes import ProcessTable\n"
        "Path.write_text = lambda *a, **k: os._exit(3)  # dies as it records\n"
        "ProcessTable(Path(sys.argv[1])).spawn('slurmd-gpu-03', sys.argv[2:])\n"
    )
    # The daemon's command line names the state dir, as slurmd's (-f <state>/slurm.conf) does.
    r = subprocess.run(
        [sys.executable, "-c", code, str(state), *SLEEPER, str(state / "slurm.conf")],
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 3, r.stderr
    assert ProcessTable(state).records() == []
    assert wait_until(lambda: referencing(state) == [], 10), referencing(state)


def test_the_recorded_pid_is_the_daemon_and_its_environment_names_the_sandbox(
    state: Path,
) -> None:
    table = ProcessTable(state)
    rec = table.spawn("agent-gpu-01", ["sleep", "300"], {"SLURM_CONF": "/elsewhere"})
    # The held child became the daemon in place, by the time spawn returned: the same PID
    # and start time, the daemon's argv.
    assert command_line(rec.pid) == ["sleep", "300"]
    assert start_ticks(rec.pid) == rec.start_ticks
    # Nothing on its command line names the sandbox: its environment does.
    assert referencing(state) == [(rec.pid, ["sleep", "300"])]
    assert referencing(state.parent / "sta") == []  # a prefix of the name is not the name
    assert table.stop("agent-gpu-01") and referencing(state) == []


def test_spawn_waits_out_the_empty_command_line_of_an_exec_in_progress(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mid-exec, /proc/<pid>/cmdline reads empty for an instant (CI once read [] right after
    spawn returned): that is not "the daemon runs", so spawn reads again until it is."""
    seen: list[list[str]] = []

    def exec_in_progress_once(pid: int) -> list[str]:
        argv = [] if not seen else command_line(pid)
        seen.append(argv)
        return argv

    monkeypatch.setattr(processes, "command_line", exec_in_progress_once)
    table = ProcessTable(state)
    rec = table.spawn("agent-gpu-01", ["sleep", "300"])
    assert seen[0] == [] and len(seen) > 1  # the empty read did not end the wait
    assert command_line(rec.pid) == ["sleep", "300"]
    assert table.stop("agent-gpu-01")


def test_a_missing_program_fails_the_spawn_and_records_nothing(state: Path) -> None:
    table = ProcessTable(state)
    with pytest.raises(FileNotFoundError):
        table.spawn("slurmd-gpu-01", [str(state / "no-such-slurmd"), "-D"])
    with pytest.raises(FileNotFoundError):
        table.spawn("slurmd-gpu-01", ["no-such-slurmd-anywhere", "-D"])
    assert table.records() == []


def test_down_stops_what_a_stopped_daemon_left_running(state: Path) -> None:
    """A command a daemon had in flight when it was stopped (the API's `sinfo`) is in that
    daemon's session and names the sandbox: `stop_left_behind` (the end of `sandbox down`)
    stops it. A process of another session that names the sandbox (an operator's shell
    with its SLURM_CONF exported) is not the sandbox's: it is left alone."""
    table = ProcessTable(state)
    pid_file = state / "child.pid"
    starts_a_child = (
        "import pathlib, subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
        "time.sleep(300)\n"
    )
    rec = table.spawn("api", [sys.executable, "-c", starts_a_child])
    outsider = subprocess.Popen(
        ["sleep", "300"],
        env={**os.environ, "SLURM_CONF": str(state / "slurm.conf")},
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", 10)
        child = int(pid_file.read_text())
        assert table.stop("api")
        assert start_ticks(child) is not None  # the daemon's stop left its command running
        assert processes.stop_left_behind(state, {rec.pid}) == [(child, ["sleep", "300"])]
        assert start_ticks(child) is None
        assert start_ticks(outsider.pid) is not None
        assert processes.stop_left_behind(state, {rec.pid}) == []
    finally:
        outsider.kill()
        outsider.wait()


def test_a_record_removed_while_the_table_is_listed_is_left_out(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop removes its record while another reader lists the table (a cluster's delete
    beside a poll of what still runs): the reader sees the others, never a crash (CI saw
    FileNotFoundError on mariadb.json)."""
    table = ProcessTable(state)
    table.dir.mkdir(parents=True, exist_ok=True)
    kept = ProcessRecord(name="slurmd-gpu-01", pid=1, start_ticks=1, argv=["slurmd"], log="x")
    (table.dir / "slurmd-gpu-01.json").write_text(kept.model_dump_json())
    listed = [table.dir / "mariadb.json", table.dir / "slurmd-gpu-01.json"]  # one gone since
    monkeypatch.setattr(type(table.dir), "glob", lambda self, pattern: iter(listed))
    assert table.records() == [kept]
