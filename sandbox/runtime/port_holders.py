"""Who holds a TCP port, read from /proc: said when a daemon the sandbox started could not
bind its port ("address already in use"), so the failure names the process in the way (or
says that only closing connections hold it) instead of leaving a guess.

/proc/net/tcp lists every IPv4 socket with its local port, state and inode; a process holds
a socket when one of its /proc/<pid>/fd links to `socket:[inode]`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from autoclusters.core.process_start import command_line

# /proc/net/tcp's `st` column (include/net/tcp_states.h).
STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
    "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
    "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}  # fmt: skip
IN_USE = "address already in use"
# An address's port (`127.0.0.1:7233`, `[::]:7233`, `localhost:7233`) or a `port: 7233`.
PORT = re.compile(r"(?:\d{1,3}(?:\.\d{1,3}){3}|\]|localhost):(\d{2,5})\b|\bport:? (\d{2,5})\b")


@dataclass(frozen=True)
class Holder:
    state: str
    pid: int | None  # None: no process has it (a closing connection the kernel keeps)
    argv: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.pid is None:
            return f"{self.state} (no process)"
        return f"{self.state} by PID {self.pid} ({' '.join(self.argv)[:120]})"


def _sockets(port: int, proc: Path) -> dict[str, str]:
    """Every socket bound to local `port`: inode -> state."""
    inodes: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes[f[9]] = STATES.get(f[3], f[3])
    return inodes


def listens(pid: int, port: int, proc: Path = Path("/proc")) -> bool:
    """Whether process `pid` itself listens on `port`: a daemon that answers there is the
    one started, not whatever else holds the port (which may accept and never answer)."""
    listening = {i for i, state in _sockets(port, proc).items() if state == "LISTEN"}
    if not listening:
        return False
    try:
        fds = list((proc / str(pid) / "fd").iterdir())
    except OSError:
        return False  # gone
    for fd in fds:
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.removeprefix("socket:[").removesuffix("]") in listening:
            return True
    return False


def holders(port: int, proc: Path = Path("/proc")) -> list[Holder]:
    """Every socket bound to local `port`, with the process that has it open."""
    inodes = _sockets(port, proc)
    if not inodes:
        return []  # nothing bound there: no process to look for
    found: list[Holder] = []
    owned: set[str] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            fds = list((pid_dir / "fd").iterdir())
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue  # closed meanwhile (the listing's own, for one)
            inode = link.removeprefix("socket:[").removesuffix("]")
            if link.startswith("socket:[") and inode in inodes and inode not in owned:
                owned.add(inode)
                pid = int(pid_dir.name)
                found.append(Holder(inodes[inode], pid, tuple(command_line(pid))))
    found += [Holder(state, None) for inode, state in inodes.items() if inode not in owned]
    return found


def explain(log_tail: str) -> str:
    """For each port a log says it could not bind: who holds it now ("" if none is said)."""
    lines = []
    said_in_use = [line for line in log_tail.splitlines() if IN_USE in line.lower()]
    ports = {int(a or b) for line in said_in_use for a, b in PORT.findall(line)}
    for port in sorted(ports):
        held = holders(port)
        said = "; ".join(map(str, held)) if held else "nothing now"
        lines.append(f"port {port} was in use: {said}")
    return "\n".join(lines)
