"""The start-time reader every PID check uses (core/process_start.py): a running process has
one, stable for its life; a zombie or a process that is gone has none."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from autoclusters.core.process_start import parent_pid, start_ticks


def test_a_running_process_has_a_stable_start_time() -> None:
    first = start_ticks(os.getpid())
    assert first is not None and first > 0
    assert start_ticks(os.getpid()) == first


def test_a_zombie_and_a_reaped_process_have_none() -> None:
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    # Not reaped yet: the child holds its PID as a zombie once `true` has exited.
    while start_ticks(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert start_ticks(child.pid) is None
    child.wait()
    assert start_ticks(child.pid) is None


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path: Path) -> None:
    # The name (field 2, in parentheses) is the executable's file name: a `) (` inside it
    # must not shift the fields after it.
    odd = tmp_path / "a) (b c"
    odd.symlink_to(shutil.which("sleep") or "/bin/sleep")
    child = subprocess.Popen([str(odd), "30"])
    try:
        assert Path(f"/proc/{child.pid}/stat").read_text().count(")") >= 2
        ticks = start_ticks(child.pid)
        mine = start_ticks(os.getpid())
        assert ticks is not None and mine is not None and ticks >= mine
        assert parent_pid(child.pid) == os.getpid()  # field 4, past the odd name too
    finally:
        child.kill()
        child.wait()


def test_the_parent_of_a_process_and_of_none() -> None:
    assert parent_pid(os.getpid()) == os.getppid()
    child = subprocess.Popen(["true"])
    child.wait()
    assert parent_pid(child.pid) is None  # reaped: gone
