"""Daemons recorded by PID: started here, stopped by exactly that PID, never by name.

A record holds the PID and the process start time from /proc, so a reused PID is never
mistaken for ours.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from autoclusters.core.process_start import start_ticks


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
        if not self.dir.exists():
            return []
        return [
            ProcessRecord.model_validate_json(p.read_text())
            for p in sorted(self.dir.glob("*.json"))
        ]

    def alive(self, name: str) -> bool:
        rec = self.get(name)
        return rec is not None and start_ticks(rec.pid) == rec.start_ticks

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> ProcessRecord:
        if self.alive(name):
            raise RuntimeError(f"{name} is already running")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"{name}.out"
        with open(log, "ab") as out:
            # Own session: the daemon outlives the CLI that started it, and a Ctrl-C in the
            # terminal does not reach it.
            proc = subprocess.Popen(
                list(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        ticks = start_ticks(proc.pid)
        rec = ProcessRecord(
            name=name, pid=proc.pid, start_ticks=ticks or 0, argv=list(argv), log=str(log)
        )
        tmp = self._path(name).with_suffix(".tmp")
        tmp.write_text(rec.model_dump_json())
        tmp.replace(self._path(name))
        return rec

    def stop(self, name: str, timeout_s: float = 15.0) -> bool:
        """SIGTERM the recorded PID, SIGKILL after `timeout_s`; True if it was running."""
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
                _signal(rec.pid, signal.SIGKILL)
                while not _exited(rec):
                    time.sleep(0.05)
        self._path(name).unlink(missing_ok=True)
        return was_running

    def kill(self, name: str) -> int | None:
        """SIGKILL the recorded PID (a crash, not a shutdown); return it, None if not running."""
        rec = self.get(name)
        if rec is None or start_ticks(rec.pid) != rec.start_ticks:
            return None
        _signal(rec.pid, signal.SIGKILL)
        while not _exited(rec):
            time.sleep(0.05)
        self._path(name).unlink(missing_ok=True)
        return rec.pid

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.log_dir / f"{name}.out"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


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
