"""When a process started, read from /proc: what tells the process we recorded from another
that the kernel has since given the same PID, so we only ever signal (or trust) our own."""

from __future__ import annotations

from pathlib import Path


def start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (start time, clock ticks since boot); None if the process
    is gone or a zombie (a zombie holds its PID but runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) sits in parentheses and may itself hold spaces and ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])
