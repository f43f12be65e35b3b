"""A hung job's Python stacks on this node, grouped as ByteRobust groups them.

When the agent names a hung job's culprit on its node, it dumps the stacks of the job's
ranks here with py-spy (`py-spy dump --nonblocking --json --pid <pid>`, each rank at once,
bounded by a timeout): the main thread's frames, innermost first. Identical stacks form a
group; in a hung job most ranks wait in the same collective, so the smallest group (the
one holding the culprit on a tie) is the outlier, and it is named. `--nonblocking`: py-spy
reads the process's memory without pausing it, which also works on a stopped process
(SIGSTOP), where its default (attach and pause) fails.

py-spy is optional (a PyPI package, `pip install py-spy`): where it is not installed, or a
dump fails (no permission to read the process, a rank that is not Python), the evidence
says so, and nothing else changes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIMEOUT_S = 10.0  # all the ranks' dumps together
# The evidence of a report is kept whole only under 8 KiB (core/fault_evidence.py): the
# innermost frames (where it waits, then how it got there), a few groups.
MAX_FRAMES = 16
MAX_FRAME_CHARS = 120
MAX_GROUPS = 4
MAX_RANKS = 64  # a node runs eight; more is not a training job's


@dataclass(frozen=True)
class RankStack:
    rank: int
    pid: int
    frames: tuple[str, ...] = ()  # "function (file:line)", innermost first
    error: str | None = None  # the dump failed: why


def find_py_spy(name: str) -> str | None:
    """py-spy's path: `name` as a path, on PATH, or beside this interpreter (a venv)."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) else None
    beside = str(Path(sys.executable).parent)
    return shutil.which(name) or shutil.which(name, path=beside)


def main_frames(dump: Any) -> tuple[str, ...]:
    """The main thread's frames from py-spy's JSON (the first thread when none is named
    so), as "function (file:line)"."""
    threads = [t for t in dump if isinstance(t, dict)] if isinstance(dump, list) else []
    if not threads:
        return ()
    main = next((t for t in threads if t.get("thread_name") == "MainThread"), threads[0])
    raw = main.get("frames")
    frames: list[Any] = raw if isinstance(raw, list) else []
    out = []
    for f in frames[:MAX_FRAMES]:
        if isinstance(f, dict):
            where = f.get("short_filename") or f.get("filename") or "?"
            text = f"{f.get('name', '?')} ({where}:{f.get('line', '?')})"
            out.append(text[:MAX_FRAME_CHARS])
    return tuple(out)


def dump_stacks(py_spy: str, pids: dict[int, int], timeout_s: float = TIMEOUT_S) -> list[RankStack]:
    """Each rank's stack (rank -> pid), all dumped at once; a failure is said per rank."""
    started: dict[int, tuple[int, subprocess.Popen[bytes]]] = {}
    out: list[RankStack] = []
    for rank, pid in sorted(pids.items())[:MAX_RANKS]:
        argv = [py_spy, "dump", "--nonblocking", "--json", "--pid", str(pid)]
        try:
            started[rank] = (
                pid,
                subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE),
            )
        except OSError as e:
            out.append(RankStack(rank, pid, error=f"py-spy did not start: {e}"))
    deadline = time.monotonic() + timeout_s
    for rank, (pid, proc) in started.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()  # ours, by its own handle
            proc.communicate()
            out.append(RankStack(rank, pid, error=f"no dump within {timeout_s:.0f}s"))
            continue
        if proc.returncode != 0:
            why = stderr.decode(errors="replace").strip().splitlines()
            out.append(RankStack(rank, pid, error=(why[0] if why else "failed")[:200]))
            continue
        try:
            frames = main_frames(json.loads(stdout))
        except ValueError:
            out.append(RankStack(rank, pid, error="unreadable py-spy output"))
            continue
        out.append(RankStack(rank, pid, frames=frames))
    return sorted(out, key=lambda s: s.rank)


def group_stacks(stacks: Iterable[RankStack], culprits: Iterable[int] = ()) -> dict[str, Any]:
    """Identical stacks grouped, largest first; the outlier: the smallest group when there
    are several (on a tie, the one with a culprit rank); failed dumps listed apart."""
    named = set(culprits)
    groups: dict[tuple[str, ...], list[int]] = {}
    failed: dict[int, str] = {}
    for s in stacks:
        if s.error is not None:
            failed[s.rank] = s.error
        else:
            groups.setdefault(s.frames, []).append(s.rank)
    ordered = sorted(groups.items(), key=lambda g: (-len(g[1]), g[1]))
    outlier = None
    if len(ordered) > 1:
        smallest = min(len(r) for _f, r in ordered)
        few = [r for _f, r in ordered if len(r) == smallest]
        outlier = next((r for r in few if named & set(r)), few[-1])
    # The largest groups and the outlier, whatever the count.
    kept = [g for g in ordered if g[1] is not outlier][: MAX_GROUPS - 1]
    kept += [g for g in ordered if g[1] is outlier]
    return {
        "tool": "py-spy",
        "groups": [{"ranks": ranks, "frames": list(frames)} for frames, ranks in kept],
        "groups_left_out": len(ordered) - len(kept),
        "outlier_ranks": outlier,
        "failed": {str(k): v for k, v in sorted(failed.items())},
    }


def stacks_evidence(
    py_spy: str | None, pids: dict[int, int], culprits: Iterable[int]
) -> dict[str, Any]:
    """What a JOB_HANG's evidence says of the stacks: grouped, or why there are none."""
    if py_spy is None:
        return {"tool": "py-spy", "detail": "py-spy is not installed on this node: no stacks"}
    if not pids:
        return {"tool": "py-spy", "detail": "no pid of the job's ranks on this node"}
    return group_stacks(dump_stacks(py_spy, pids), culprits)
