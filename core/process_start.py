"""When a process started, read from /proc: what tells the process we recorded from another
that the kernel has since given the same PID, so we only ever signal (or trust) our own."""

from __future__ import annotations

from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (the state) on; None if the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) sits in parentheses and may itself hold spaces and ')'.
    return stat[stat.rindex(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time, clock ticks since boot); None if the process
    is gone or a zombie (a zombie holds its PID but runs nothing)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def parent_pid(pid: int) -> int | None:
    """Field 4 of /proc/<pid>/stat; None if the process is gone."""
    fields = _stat_fields(pid)
    return None if fields is None else int(fields[1])


def command_line(pid: int) -> list[str]:
    """/proc/<pid>/cmdline as its arguments; [] if the process is gone (or a zombie, or a
    kernel thread: nothing to read)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]
