"""Job progress, read where it lives: what each training rank tells its node's agent.

One file, the standard library only, importing nothing else of AutoClusters: training code
uses it without installing the project (the example job imports it from its own directory,
examples/training/job_progress.py, a link to this file), and the agent reads what it writes
with the same code (`read_progress`), so the format has one definition.

A rank calls it once per step, and marks its collectives and its declared pauses:

    progress = JobProgress()  # from the environment; a no-op unless the directory is set
    for step in ...:
        ...forward, backward...
        with progress.collective("all_reduce"):
            dist.all_reduce(grads)
        progress.step(step)
        if step % ckpt_every == 0:
            with progress.paused("checkpoint"):
                save(...)

What it writes: one JSON file per rank, `<dir>/<job>/rank-<rank>.json`: the job, the rank,
its node and pid, the last step's number, when it ended, its wall time and its busy time
(the step's time outside collectives and declared pauses: the part a slow GPU stretches;
the others wait for it inside the collective), how many collectives it entered, whether it
is inside one now (and since when), a declared pause (and since when), and the last
`window` steps' (number, time, busy time). Written atomically (a temporary file beside it,
then `os.replace`; no fsync: the agent reads the page cache), and at most once per
`min_interval_s`, so a step costs a dict update and, now and then, one small write. A
daemon thread writes the current state every `heartbeat_s` as well: the file's
`written_at` is the rank's heartbeat, fresh while the process runs (inside a collective
too), frozen when it is stopped (SIGSTOP) or wedged with its interpreter.

Where: `$AUTOCLUSTERS_PROGRESS_DIR` (or `directory=`); unset, every call returns at once and
nothing is written: a job that does not opt in loses nothing, and one that does never
fails for it (a write that fails is counted in `write_errors`, the next one tries again).
The job's identity comes from Slurm's and torchrun's environment (SLURM_JOB_ID,
SLURM_RESTART_COUNT, RANK or SLURM_PROCID, WORLD_SIZE or SLURM_NTASKS, LOCAL_RANK,
SLURMD_NODENAME), and its name, partition and account (SLURM_JOB_NAME, SLURM_JOB_PARTITION,
SLURM_JOB_ACCOUNT: the policy's per-job thresholds match them); a job that re-forms its
group calls `regroup`. `close` (at exit too)
removes the file: a job that ended is not a job that hangs.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_DIR = "AUTOCLUSTERS_PROGRESS_DIR"
FORMAT = 1
# Bounds on what the agent accepts: the files are written by users' code.
MAX_FILE_BYTES = 64 * 1024
MAX_FILES = 4096
MAX_WINDOW = 256
MAX_TEXT = 128


def _env_int(env: dict[str, str], *names: str) -> int | None:
    for name in names:
        value = env.get(name, "").strip()
        if value.lstrip("-").isdigit():
            return int(value)
    return None


def rank_file(directory: Path, job: str, rank: int) -> Path:
    return directory / _safe(job) / f"rank-{rank}.json"


def _safe(name: str) -> str:
    """A job id as one path component."""
    out = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)[:MAX_TEXT]
    return out.lstrip(".") or "job"


class JobProgress:
    """One rank's progress. Thread-safe; every method is cheap and never raises for I/O."""

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        job: str | None = None,
        rank: int | None = None,
        world: int | None = None,
        node: str | None = None,
        local_rank: int | None = None,
        restart: int | None = None,
        generation: int = 0,
        min_interval_s: float = 1.0,
        heartbeat_s: float = 5.0,
        window: int = 32,
        hang_floor_s: float | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        heartbeat: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        e = dict(os.environ if env is None else env)
        where = directory if directory is not None else e.get(ENV_DIR) or None
        self.directory = Path(where) if where else None
        self.job = job or e.get("SLURM_JOB_ID") or e.get("TORCHELASTIC_RUN_ID") or "local"
        self.rank = rank if rank is not None else _env_int(e, "RANK", "SLURM_PROCID") or 0
        self.world = world if world is not None else _env_int(e, "WORLD_SIZE", "SLURM_NTASKS")
        self.node = node or e.get("SLURMD_NODENAME") or socket.gethostname()
        # What the cluster policy's per-job thresholds match (core/job_thresholds.py).
        self.job_name = e.get("SLURM_JOB_NAME") or None
        self.partition = e.get("SLURM_JOB_PARTITION") or None
        self.account = e.get("SLURM_JOB_ACCOUNT") or None
        self.local_rank = (
            local_rank if local_rank is not None else _env_int(e, "LOCAL_RANK", "SLURM_LOCALID")
        )
        self.restart = restart if restart is not None else _env_int(e, "SLURM_RESTART_COUNT") or 0
        self.generation = generation
        self.min_interval_s = min_interval_s
        self.heartbeat_s = heartbeat_s
        self.hang_floor_s = hang_floor_s
        self.clock, self.monotonic = clock, monotonic
        self.write_errors = 0
        self.writes = 0
        self._heartbeat = heartbeat
        self._lock = threading.RLock()
        self._recent: deque[tuple[int, float, float]] = deque(maxlen=max(1, min(window, 256)))
        self._step = 0
        self._stepped_at: float | None = None
        self._step_time: float | None = None
        self._busy: float | None = None
        self._last_step_mono: float | None = None  # None: the next step has no time
        self._excluded = 0.0  # this step's seconds inside collectives and pauses
        self._collectives = 0
        self._depth = 0
        self._collective: str | None = None
        self._collective_since: float | None = None
        self._collective_mono = 0.0
        self._pause: str | None = None
        self._pause_since: float | None = None
        self._pause_mono = 0.0
        self._last_write: float | None = None  # monotonic
        self._written: Path | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        if self.enabled:
            atexit.register(self.close)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    @property
    def path(self) -> Path | None:
        if self.directory is None:
            return None
        return rank_file(self.directory, self.job, self.rank)

    # --- what training code calls ----------------------------------------------------------

    def step(self, step: int | None = None) -> None:
        """A step ended (`step`: its number; None: the last one plus one)."""
        if not self.enabled:
            return
        with self._lock:
            now_m = self.monotonic()
            self._step = self._step + 1 if step is None else int(step)
            self._stepped_at = self.clock()
            if self._last_step_mono is not None:
                took = max(0.0, now_m - self._last_step_mono)
                busy = max(0.0, took - self._excluded)
                self._step_time, self._busy = took, busy
                self._recent.append((self._step, took, busy))
            self._last_step_mono = now_m
            self._excluded = 0.0
            self._maybe_write(now_m)

    def collective_begin(self, name: str = "collective") -> None:
        if not self.enabled:
            return
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._collectives += 1
                self._collective = name[:MAX_TEXT]
                self._collective_since = self.clock()
                self._collective_mono = self.monotonic()

    def collective_end(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._excluded += max(0.0, self.monotonic() - self._collective_mono)
                self._collective, self._collective_since = None, None

    @contextmanager
    def collective(self, name: str = "collective") -> Iterator[None]:
        self.collective_begin(name)
        try:
            yield
        finally:
            self.collective_end()

    def pause_begin(self, reason: str) -> None:
        """A declared pause (a checkpoint save, an evaluation): not a hang while it lasts
        (the agent's `pause_max_s` at most), nor slow steps. Written at once (it is rare)."""
        if not self.enabled:
            return
        with self._lock:
            self._pause, self._pause_since = reason[:MAX_TEXT], self.clock()
            self._pause_mono = self.monotonic()
            self._maybe_write(self._pause_mono, force=True)

    def pause_end(self) -> None:
        if not self.enabled:
            return
        with self._lock:
            if self._pause is None:
                return
            now_m = self.monotonic()
            self._excluded += max(0.0, now_m - self._pause_mono)
            self._pause, self._pause_since = None, None
            self._maybe_write(now_m, force=True)

    @contextmanager
    def paused(self, reason: str) -> Iterator[None]:
        self.pause_begin(reason)
        try:
            yield
        finally:
            self.pause_end()

    def regroup(self, *, rank: int, world: int | None, generation: int = 0) -> None:
        """The job re-formed its group: this process is now `rank` of `world`. The old
        rank's file goes; the next step's time is not measured (it spans the re-forming)."""
        if not self.enabled:
            return
        with self._lock:
            if (rank, world, generation) == (self.rank, self.world, self.generation):
                return
            self._remove()
            self.rank, self.world, self.generation = rank, world, generation
            self._last_step_mono = None
            self._excluded = 0.0

    def beat(self) -> None:
        """Write the state if nothing was written for `heartbeat_s` (the heartbeat thread
        calls this; tests call it with their clock)."""
        if not self.enabled:
            return
        with self._lock:
            now_m = self.monotonic()
            if self._last_write is not None and now_m - self._last_write >= self.heartbeat_s:
                self._maybe_write(now_m, force=True)

    def close(self) -> None:
        """The rank is done: stop the heartbeat and remove the file."""
        if not self.enabled or self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._lock:
            self._remove()

    # --- the file ----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "v": FORMAT, "job": self.job, "restart": self.restart,
                "generation": self.generation, "rank": self.rank, "world": self.world,
                "node": self.node, "local_rank": self.local_rank, "pid": os.getpid(),
                "step": self._step, "stepped_at": self._stepped_at,
                "step_time_s": self._step_time, "busy_s": self._busy,
                "collectives": self._collectives, "collective": self._collective,
                "collective_since": self._collective_since, "pause": self._pause,
                "pause_since": self._pause_since,
                "recent": [[s, round(t, 6), round(b, 6)] for s, t, b in self._recent],
                "heartbeat_s": self.heartbeat_s, "hang_floor_s": self.hang_floor_s,
                "job_name": self.job_name, "partition": self.partition,
                "account": self.account, "written_at": self.clock(),
            }  # fmt: skip

    def _maybe_write(self, now_m: float, *, force: bool = False) -> None:
        if self._closed:
            return
        last = self._last_write
        if not force and last is not None and now_m - last < self.min_interval_s:
            return
        self._last_write = now_m
        path = self.path
        assert path is not None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.state(), separators=(",", ":")))
            os.replace(tmp, path)
            self._written = path
            self.writes += 1
        except OSError:
            self.write_errors += 1
            self._last_write = None  # try again at the next call
            return
        if self._heartbeat and self._thread is None:
            self._thread = threading.Thread(
                target=self._beat_forever, name="job-progress", daemon=True
            )
            self._thread.start()

    def _beat_forever(self) -> None:
        while not self._stop.wait(self.heartbeat_s / 2):
            self.beat()

    def _remove(self) -> None:
        if self._written is not None:
            try:
                self._written.unlink()
            except OSError:
                pass
            self._written = None
            self._last_write = None


# --- reading (the agent) -----------------------------------------------------------------


@dataclass(frozen=True)
class RankProgress:
    """One rank's file as the agent read it."""

    job: str
    rank: int
    node: str
    written_at: float
    restart: int = 0
    generation: int = 0
    world: int | None = None
    local_rank: int | None = None
    pid: int | None = None
    step: int = 0
    stepped_at: float | None = None
    step_time_s: float | None = None
    busy_s: float | None = None
    collectives: int = 0
    collective: str | None = None
    collective_since: float | None = None
    pause: str | None = None
    pause_since: float | None = None
    recent: tuple[tuple[int, float, float], ...] = ()
    heartbeat_s: float = 5.0
    hang_floor_s: float | None = None
    path: str = ""
    job_name: str | None = None  # Slurm's, for the policy's per-job thresholds
    partition: str | None = None
    account: str | None = None

    @property
    def in_collective(self) -> bool:
        return self.collective_since is not None

    @property
    def position(self) -> tuple[int, int]:
        """How far it got: steps, then collectives entered."""
        return (self.step, self.collectives)


def _num(v: Any, *, low: float = 0.0) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) and f >= low else None


def _int(v: Any, *, low: int = 0) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int) or v < low or v > 2**53:
        return None
    return v


def _text(v: Any) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) and v else None


def parse_rank(data: Any, path: str = "") -> RankProgress | None:
    """A rank file's JSON, checked field by field; None when it is not one."""
    if not isinstance(data, dict) or data.get("v") != FORMAT:
        return None
    job, node = _text(data.get("job")), _text(data.get("node"))
    rank, written = _int(data.get("rank")), _num(data.get("written_at"))
    if job is None or node is None or rank is None or written is None:
        return None
    recent: list[tuple[int, float, float]] = []
    raw = data.get("recent")
    for item in raw[-MAX_WINDOW:] if isinstance(raw, list) else []:
        if isinstance(item, list) and len(item) == 3:
            s, t, b = _int(item[0]), _num(item[1]), _num(item[2])
            if s is not None and t is not None and b is not None:
                recent.append((s, t, b))
    return RankProgress(
        job=job, rank=rank, node=node, written_at=written,
        restart=_int(data.get("restart")) or 0,
        generation=_int(data.get("generation")) or 0,
        world=_int(data.get("world"), low=1), local_rank=_int(data.get("local_rank")),
        pid=_int(data.get("pid"), low=1), step=_int(data.get("step")) or 0,
        stepped_at=_num(data.get("stepped_at")), step_time_s=_num(data.get("step_time_s")),
        busy_s=_num(data.get("busy_s")), collectives=_int(data.get("collectives")) or 0,
        collective=_text(data.get("collective")),
        collective_since=_num(data.get("collective_since")),
        pause=_text(data.get("pause")), pause_since=_num(data.get("pause_since")),
        recent=tuple(recent), heartbeat_s=_num(data.get("heartbeat_s"), low=0.001) or 5.0,
        hang_floor_s=_num(data.get("hang_floor_s"), low=0.001), path=path,
        job_name=_text(data.get("job_name")), partition=_text(data.get("partition")),
        account=_text(data.get("account")),
    )  # fmt: skip


def read_progress(directory: Path) -> list[RankProgress]:
    """Every rank file under `directory` (`<job>/rank-<n>.json`), sorted by job and rank;
    files that are unreadable, too large or not rank files are skipped."""
    out: list[RankProgress] = []
    try:
        jobs = sorted(p for p in directory.iterdir() if p.is_dir())
    except OSError:
        return out
    seen = 0
    for job_dir in jobs:
        try:
            names = sorted(job_dir.glob("rank-*.json"))
        except OSError:
            continue
        for path in names:
            seen += 1
            if seen > MAX_FILES:
                return sorted(out, key=lambda r: (r.job, r.rank))
            try:
                if path.stat().st_size > MAX_FILE_BYTES:
                    continue
                data = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue  # gone meanwhile, or half a file from a writer without os.replace
            rank = parse_rank(data, str(path))
            if rank is not None:
                out.append(rank)
    return sorted(out, key=lambda r: (r.job, r.rank))
