"""Daemons recorded by PID: started here, stopped by exactly that PID, never by name.

A record holds the PID and the process start time from /proc, so a reused PID is never
mistaken for ours.

Several processes act on one table (the CLI, the Crusoe emulator's machines, the emulated
Slinky kubelet in the operator), so a name's record changes only under that name's lock
(`<state>/pids/<name>.lock`, flock): a stop that waited for its process to exit never
removes the record of a newer process someone started meanwhile (which then ran on,
recorded nowhere: a leaked slurmd). And a daemon runs only once it is recorded: the child
waits (a shell reading its stdin) until the record is written, then execs the daemon in
the same PID; a spawner that dies first closes that pipe and the child exits without
running it.

`referencing(state_dir)` finds, by reading /proc, every live process whose command line or
environment names the sandbox's state dir, recorded or not: what a leak check looks for.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel

from autoclusters.core.process_start import command_line, parent_pid, start_ticks

# Every process the table starts carries its sandbox's state dir in its environment (and
# so do the processes it starts in turn): how `referencing` finds one that escaped.
STATE_ENV = "AUTOCLUSTERS_SANDBOX_STATE"
# The child's first program: it waits for the spawner's word (the record is written),
# then becomes the daemon (exec: the same PID, the same start time); on EOF, it exits.
_HOLD = 'read -r go && [ "$go" = go ] && exec "$@" </dev/null'


class ProcessRecord(BaseModel):
    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    log: str


class ProcessTable:
    """The sandbox's processes, one JSON record per name under <state>/pids/."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir / "pids"
        self.log_dir = state_dir / "log"

    def _path(self, name: str) -> Path:
        return self.dir / f"{name}.json"

    def get(self, name: str) -> ProcessRecord | None:
        try:
            return ProcessRecord.model_validate_json(self._path(name).read_text())
        except FileNotFoundError:
            return None

    def records(self) -> list[ProcessRecord]:
        """Every recorded process. A record removed between the listing and its read is
        a process stopped meanwhile (its stopper removes it): left out, as `get` says None."""
        if not self.dir.exists():
            return []
        found = (self.get(p.stem) for p in sorted(self.dir.glob("*.json")))
        return [r for r in found if r is not None]

    def alive(self, name: str) -> bool:
        rec = self.get(name)
        return rec is not None and start_ticks(rec.pid) == rec.start_ticks

    @contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """The name's lock, across threads and processes (released if its holder dies)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the flock

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> ProcessRecord:
        full_env = {**os.environ, **(env or {}), STATE_ENV: str(self.dir.parent)}
        _check_executable(argv[0], full_env.get("PATH"))  # as Popen of it would, at once
        with self._locked(name):
            if self.alive(name):
                raise RuntimeError(f"{name} is already running")
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log = self.log_dir / f"{name}.out"
            with open(log, "ab") as out:
                # Own session: the daemon outlives the CLI that started it, and a Ctrl-C in
                # the terminal does not reach it.
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", _HOLD, "sandbox-spawn", *argv],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.PIPE,
                    env=full_env,
                    start_new_session=True,
                )
            assert proc.stdin is not None
            try:
                ticks = start_ticks(proc.pid)
                if ticks is None:
                    raise RuntimeError(f"{name}: its process exited before it was recorded")
                rec = ProcessRecord(
                    name=name, pid=proc.pid, start_ticks=ticks, argv=list(argv), log=str(log)
                )
                tmp = self._path(name).with_suffix(".tmp")
                tmp.write_text(rec.model_dump_json())
                tmp.replace(self._path(name))
            except BaseException:
                proc.stdin.close()  # EOF: the child exits without running the daemon
                proc.wait()
                raise
            try:
                proc.stdin.write(b"go\n")  # recorded: now it may run
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it is gone already: a recorded process that is not alive
            # As Popen returns once its child has exec'd: the PID runs the daemon (what a
            # caller reads in /proc/<pid>/cmdline), or has exited. Mid-exec the kernel shows
            # an empty command line for an instant: that is neither, so it is waited out.
            held = ["/bin/sh", "-c", _HOLD, "sandbox-spawn"]

            def runs_the_daemon() -> bool:
                argv_now = command_line(proc.pid)
                return proc.poll() is not None or (argv_now != [] and argv_now[:4] != held)

            wait_until(runs_the_daemon, 10, 0.001)
        return rec

    def stop(self, name: str, timeout_s: float = 15.0) -> bool:
        """SIGTERM the recorded PID, SIGKILL after `timeout_s`; True if it was running.
        The record goes with it; a process started under the name meanwhile waits for
        this to finish, and is recorded after it."""
        if self.get(name) is None:
            return False
        with self._locked(name):
            rec = self.get(name)
            if rec is None:
                return False
            was_running = start_ticks(rec.pid) == rec.start_ticks
            if was_running:
                _signal(rec.pid, signal.SIGTERM)
                deadline = time.monotonic() + timeout_s
                while not _exited(rec) and time.monotonic() < deadline:
                    time.sleep(0.05)
                if not _exited(rec):
                    _kill_and_reap(rec)
            self._path(name).unlink(missing_ok=True)
        return was_running

    def kill(self, name: str) -> int | None:
        """SIGKILL the recorded PID (a crash, not a shutdown); return it, None if not running."""
        if self.get(name) is None:
            return None
        with self._locked(name):
            rec = self.get(name)
            if rec is None or start_ticks(rec.pid) != rec.start_ticks:
                return None
            _kill_and_reap(rec)
            self._path(name).unlink(missing_ok=True)
        return rec.pid

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.out"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _check_executable(exe: str, path: str | None) -> None:
    found = exe if "/" in exe else shutil.which(exe, path=path)
    if found is None or not os.access(found, os.X_OK) or Path(found).is_dir():
        raise FileNotFoundError(2, "No such file or directory", exe)


def _kill_and_reap(rec: ProcessRecord) -> None:
    """SIGKILL the recorded process and wait until it is gone (it cannot refuse)."""
    _signal(rec.pid, signal.SIGKILL)
    while not _exited(rec):
        time.sleep(0.05)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _exited(rec: ProcessRecord) -> bool:
    # Reap it if it is our own child, so it does not linger as a zombie.
    try:
        os.waitpid(rec.pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return start_ticks(rec.pid) != rec.start_ticks


def wait_until(check: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Poll `check()` until it is true or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval_s)
    return check()


def write_json(path: Path, doc: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2))
    tmp.replace(path)


def sessions_holding(prefix: Path) -> set[int]:
    """Session ids of processes with a file open under `prefix`.

    slurmstepd (which runs a node's job steps) daemonizes out of slurmd's session but keeps
    its socket in the node's spool directory: this is how the processes of one sandbox
    "machine" are found without matching on names.
    """
    sids: set[int] = set()
    root = str(prefix.resolve())
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd).startswith(root):
                    sids.add(os.getsid(int(proc.name)))
                    break
        except (FileNotFoundError, PermissionError, ProcessLookupError, NotADirectoryError):
            continue
    sids.discard(os.getsid(0))  # never our own session
    return sids


def kill_sessions(sids: set[int], timeout_s: float = 5.0) -> int:
    """SIGKILL every process in the given sessions (a machine losing power); return the count."""
    victims = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if os.getsid(int(proc.name)) in sids:
                    victims.append(int(proc.name))
            except ProcessLookupError:
                continue
    for pid in victims:
        _signal(pid, signal.SIGKILL)
    wait_until(lambda: all(start_ticks(p) is None for p in victims), timeout_s, 0.05)
    return len(victims)


def referencing(state_dir: Path) -> list[tuple[int, list[str]]]:
    """Live processes (PID, command line) whose command line or environment names
    `state_dir` or a path under it: the sandbox's daemons, recorded or not, and whatever
    they started. Never this process or those above it (a test's own)."""
    return [(pid, argv) for pid, argv, _ in _referencing(state_dir)]


def _referencing(state_dir: Path) -> list[tuple[int, list[str], int]]:
    """`referencing`, with each process's start time (read once, to signal only it)."""
    names = {str(state_dir), str(state_dir.resolve())}
    pattern = re.compile(b"|".join(re.escape(n.encode()) for n in names) + rb"(?=/|\0|$)")
    ours: set[int] = set()
    pid: int | None = os.getpid()
    while pid is not None and pid > 1:
        ours.add(pid)
        pid = parent_pid(pid)
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) in ours:
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if not (pattern.search(cmdline) or pattern.search(environ)):
            continue
        ticks = start_ticks(int(proc.name))
        if ticks is not None:
            argv = cmdline.decode(errors="replace").split("\0")[:-1]
            found.append((int(proc.name), argv, ticks))
    return sorted(found)


def stop_left_behind(
    state_dir: Path, leaders: set[int], timeout_s: float = 5.0
) -> list[tuple[int, list[str]]]:
    """SIGKILL, each by its PID (and start time), what the sandbox's daemons started and
    left running when they were stopped: a Slurm command in flight when the API or the
    worker went down outlives it, and with slurmctld gone it retries for a while. Each
    daemon leads a session of its own (`spawn`), so such a process is in the session of a
    recorded daemon (`leaders`: their PIDs) and names the state dir (its SLURM_CONF); a
    leader itself, stopped already, is never one. Returns what it stopped."""

    def session(pid: int) -> int | None:
        try:
            return os.getsid(pid)
        except ProcessLookupError:
            return None

    found = [
        (pid, argv, ticks)
        for pid, argv, ticks in _referencing(state_dir)
        if pid not in leaders and session(pid) in leaders
    ]
    for pid, _, ticks in found:
        if start_ticks(pid) == ticks:
            _signal(pid, signal.SIGKILL)
    wait_until(lambda: all(start_ticks(p) != t for p, _, t in found), timeout_s, 0.05)
    return [(pid, argv) for pid, argv, _ in found]


def stop_referencing(state_dir: Path, timeout_s: float = 5.0) -> list[tuple[int, list[str]]]:
    """SIGKILL, each by its PID (and start time), every live process `referencing` finds:
    a leak check's cleanup once the sandbox is down, so what escaped its table does not
    outlive the check. Returns what it found."""
    found = _referencing(state_dir)
    for pid, _, ticks in found:
        if start_ticks(pid) == ticks:
            _signal(pid, signal.SIGKILL)
    wait_until(lambda: all(start_ticks(p) != t for p, _, t in found), timeout_s, 0.05)
    return [(pid, argv) for pid, argv, _ in found]
