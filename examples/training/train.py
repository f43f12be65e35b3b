"""A fault-tolerant DDP training job: the workload AutoClusters kills and resumes.

Launched by torchrun (one agent per node, c10d rendezvous), or in in-job mode by srun
alone. A tiny MLP learns a fixed function from synthetic batches; each step's batch depends
only on (seed, step, rank), so a run resumed from step n continues exactly the sequence an
uninterrupted run would have.

Checkpoints (torch.distributed.checkpoint) go to `<ckpt-dir>/step-<n>/`. Only once a save
has completed on every rank does rank 0 move the `latest` marker (write a temp file, fsync,
os.replace): a run killed mid-save leaves the marker at the previous checkpoint, and the
half-written directory is ignored (and removed at the next start). Under Slurm, rank 0
then records the time in the job's Comment (`ckpt_at=<epoch s>`, the Comment's other
`key=value` tokens kept), so a scheduler taking a node knows how much work each job would lose;
the first step of every run adds `run_at=<epoch s>`, when the run began that step: a run
that started from an older checkpoint, or from none, has had work at risk since then only.

In-job recovery (`--in-place HOST:PORT`, train.sbatch's SPARES mode, in_place.py): no
torchrun; one process per node meets the others in the job's store, `--train-nodes` of the
nodes train and the rest stand by. When a peer hangs (SIGUSR2 from the runbook once it
released the node: the survivors abandon their group without waiting for it) or dies (their
collective fails at once), they re-form the group with a standby in their running processes:
the new rank 0 is one that completed the newest step, its parameters and optimizer state are
broadcast, so no step is lost and nothing is restarted or imported again. Rank 0 then writes
`resumed_at=<epoch s>` to the Comment, which is how the runbook learns that the job steps
again (a run Slurm started again after a requeue writes it at its first step too: the
runbook measures what the fault cost the job from it, core/recovery_loss.py). In this mode
the gradients are all-reduced by hand, not by DDP: its reducer waits for them inside
backward(), where a signal cannot reach the rank.

SIGTERM (Slurm requeue/cancel, torchrun shutting down) and SIGUSR1 (Slurm's warning before
the time limit) make every rank stop at the same step boundary, save, and exit 128+signal.

One line per step, flushed, by the ranks `--log-ranks` picks (default: local rank 0, i.e.
one line per node):

    ts=<epoch> node=<node> restart=<n> step=<n> rank=<r> resumed_from=<n> loss=<x>

`restart` is Slurm's restart count (requeues); in-job mode adds ` elastic=<n>` at the end:
the group's generation within this run of the job (0 at the start, one more per re-forming).

Each training rank publishes its progress for the node's agent (job_progress.py, a link to
core/job_progress.py: step, step time, inside its all-reduce or not, checkpoint saves as
declared pauses) when $AUTOCLUSTERS_PROGRESS_DIR is set; otherwise that costs nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The CPU wheel warns on import when numpy is absent; this job never touches numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
# In-job mode's checkpoints: rank 0 saves alone (no_dist), which DCP notes once per process.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
if __name__ == "__main__":
    # In-job mode: the runbook's SIGUSR2 (abandon the group, in_place.py) must not kill a
    # process still importing torch; in_place.AbortRequest takes it over.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    # SIGCONT blocked in every thread (those started later inherit the mask): a stop and
    # continue (the sandbox's `slow` effect) still happens, interrupts no call (gloo's), and
    # stays pending for StopRequest.work to see that the process was stopped.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCONT})
    # A standby launched into a holder job (train.sbatch HOLDERS=1: `srun --jobid=<holder>
    # --overlap`) runs as a step of the holder, whose id and restart count Slurm puts in
    # its environment; it belongs to the training job the launcher named: its store keys,
    # its Comment (training=, resumed_at=), its log lines and its progress are that job's.
    for ours in ("TRAIN_JOB_ID", "TRAIN_RESTART_COUNT"):
        if os.environ.get(ours):
            os.environ[ours.replace("TRAIN_", "SLURM_", 1)] = os.environ[ours]

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

try:
    import job_progress  # beside this script (a link to core/job_progress.py), stdlib only
except ImportError:  # this file loaded by its path (tests): the installed package's copy
    from autoclusters.core import job_progress

if TYPE_CHECKING:  # in_place.py sits beside this script; imported where in-job mode runs
    from in_place import Generation

MARKER = "latest"
# --step-sleep's slices: a signal waits at most one; a slice during which the process was
# stopped counts for nothing (StopRequest.work).
IDLE_SLICE_S = 0.02
STEP_DIR = re.compile(r"^step-(\d+)$")
DIM = 32
# This rank's progress for the node's agent; a no-op without $AUTOCLUSTERS_PROGRESS_DIR.
PROGRESS = job_progress.JobProgress()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=0, help="total steps to reach; 0 = forever")
    p.add_argument(
        "--ckpt-dir",
        type=Path,
        default=os.environ.get("CKPT_DIR"),
        help="checkpoint directory, shared by all nodes (default: $CKPT_DIR)",
    )
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint every N steps")
    p.add_argument("--keep", type=int, default=2, help="complete checkpoints to keep (>= 1)")
    p.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        help="seconds to idle per step (the stand-in for GPU work: counted while the process runs)",
    )
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--log-ranks",
        choices=["node", "all", "zero"],
        default="node",
        help="who logs step lines: local rank 0 of each node, every rank, or rank 0",
    )
    p.add_argument(
        "--sync-save",
        action="store_true",
        help="block training while a checkpoint is written (default: dcp.async_save)",
    )
    p.add_argument(
        "--timeout", type=float, default=120, help="collective timeout, seconds (a dead peer)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument(
        "--in-place",
        metavar="HOST:PORT",
        help="in-job mode: the job's TCPStore; stand by or train, re-forming without a lost node",
    )
    p.add_argument("--train-nodes", type=int, default=1, help="in-job mode: nodes that train")
    p.add_argument("--nproc-per-node", type=int, default=1, help="in-job mode: ranks per node")
    p.add_argument(
        "--join-timeout", type=float, default=300, help="in-job mode: seconds a group may take"
    )
    p.add_argument(
        "--max-restarts", type=int, default=3, help="in-job mode: groups re-formed before giving up"
    )
    # A healthy job's pauses, for the silent-fault benchmark's run that must open nothing
    # (bench/silent.py): an evaluation every rank declares, and a data loader that stalls.
    p.add_argument(
        "--eval-every", type=int, default=0, help="pause every N steps for an evaluation (0: none)"
    )
    p.add_argument("--eval-s", type=float, default=30.0, help="seconds an evaluation takes")
    p.add_argument(
        "--data-stall-at",
        type=int,
        default=0,
        help="rank 0's data loader stalls before this step (0: never), undeclared",
    )
    p.add_argument("--data-stall-s", type=float, default=20.0, help="seconds the stall lasts")
    p.add_argument(
        "--abort-grace",
        type=float,
        default=0.2,
        help="in-job mode: seconds a collective must still wait after SIGUSR2 before the group "
        "is abandoned (a late signal to a healthy group is dismissed)",
    )
    p.add_argument(
        "--term-grace",
        type=float,
        default=0,
        help="seconds after SIGTERM before a rank stuck in a collective exits; 0 = never",
    )
    p.add_argument(
        "--stuck-grace",
        type=float,
        default=0,
        help="seconds after SIGTERM (or its last step, if later) before a rank that has not "
        "reached its next step boundary exits unsaved (a peer is hung or gone: nothing can be "
        "saved); longer than a step takes; 0 = never",
    )
    args = p.parse_args(argv)
    if args.ckpt_dir is None:
        p.error("--ckpt-dir (or $CKPT_DIR) is required")
    if args.ckpt_every < 1 or args.keep < 1:
        p.error("--ckpt-every and --keep must be >= 1")
    return args


STOP_SIGNALS = {signal.SIGTERM, signal.SIGUSR1}
# How often the signals thread looks, after a SIGTERM, whether the rank is still stuck.
STUCK_POLL_S = 0.05


class StopRequest:
    """Remembers the first SIGTERM/SIGUSR1; the training loop acts on it between steps.

    With `term_grace_s` or `stuck_grace_s`, the signals are taken by a thread (sigwait), not
    by a handler: a Python handler runs on the main thread between bytecodes, never while it
    is blocked in a gloo/NCCL collective on a dead peer. The thread sets the flag (the normal
    path: save at the step boundary) and, after a SIGTERM:
    - `term_grace_s`: if the process is still there that long after it, exits 143, so that
      the group can re-form without waiting for the collective's timeout (in-job mode);
    - `stuck_grace_s`: if the rank has finished no step for that long since it (nor begun
      its last save), exits 143: every rank got the same signal, so a rank that cannot
      reach the next step boundary is blocked in a collective (the step's all-reduce, a
      checkpoint's) on a peer that is hung or gone, and nothing can be saved with it. On a
      requeue Slurm starts the job again only once every process of the old run is gone,
      and otherwise waits (KillWait, 30 s by default) before it SIGKILLs them. A rank
      that reached its save is never cut short.
    """

    def __init__(self, term_grace_s: float = 0, stuck_grace_s: float = 0) -> None:
        self.signum = 0
        # When the rank last finished a step (monotonic), and whether it is saving the
        # checkpoint it stops with: what the stuck grace looks at.
        self._stepped_at = -float("inf")
        self._saving = False
        for sig in STOP_SIGNALS:
            # Kept with the thread too: a thread started before the mask (by an import)
            # may still receive the signal, and must not die of it.
            signal.signal(sig, self._handle)
        if term_grace_s > 0 or stuck_grace_s > 0:
            # Threads started later (gloo's) inherit the mask: only sigwait sees the signals.
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            threading.Thread(
                target=self._take, args=(term_grace_s, stuck_grace_s), name="signals", daemon=True
            ).start()

    def stepped(self) -> None:
        """A step is done: every rank took part in its collectives."""
        self._stepped_at = time.monotonic()

    @contextmanager
    def saving(self) -> Iterator[None]:
        """The checkpoint the rank stops with (or ends with): never cut short."""
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum

    def _take(self, term_grace_s: float, stuck_grace_s: float) -> None:
        while True:
            signum = signal.sigwait(STOP_SIGNALS)
            self.signum = self.signum or signum
            if signum == signal.SIGTERM:
                break
        signalled = time.monotonic()
        while True:  # until the process exits, by its own save or below
            now = time.monotonic()
            if term_grace_s > 0 and now - signalled >= term_grace_s:
                break  # still here: stuck in a collective
            idle = now - max(signalled, self._stepped_at)
            if stuck_grace_s > 0 and not self._saving and idle >= stuck_grace_s:
                break  # no step boundary reached: a peer is hung or gone
            time.sleep(STUCK_POLL_S)
        after = time.monotonic() - signalled
        emit(f"{_prefix()} event=stuck_exit signal=SIGTERM after_s={after:.2f}")
        os._exit(128 + signal.SIGTERM)

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` of wall-clock time (an evaluation, a data loader), in short slices
        so that a signal is acted on promptly."""
        end = time.monotonic() + seconds
        while not self.signum and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))

    def work(self, seconds: float) -> None:
        """Idle `seconds` of the process's own time: the step's stand-in for its GPU work.
        A slice during which the process was stopped (the sandbox's `slow` effect: a
        SIGSTOP/SIGCONT duty cycle, as a throttled GPU does less work per second) counts
        for nothing, so the step takes that much longer; time spent waiting for a CPU (a
        loaded machine) counts, as the GPU goes on meanwhile."""
        left = seconds
        while not self.signum and left > 1e-6:  # not a float's leftover of the subtractions
            want = min(left, IDLE_SLICE_S)
            began = time.monotonic()
            time.sleep(want)
            took = time.monotonic() - began
            if not was_stopped():
                left -= took


def was_stopped() -> bool:
    """Whether the process was stopped and continued since the last call: the SIGCONT that
    ended the stop is pending (blocked at start, above), and is taken here."""
    if signal.SIGCONT not in signal.sigpending():
        return False
    signal.sigwait({signal.SIGCONT})  # pending: returns at once
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def step_dirs(root: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if root.is_dir():
        for entry in root.iterdir():
            m = STEP_DIR.match(entry.name)
            if m and entry.is_dir():
                found[int(m[1])] = entry
    return found


def read_marker(root: Path) -> int:
    """The step of the last complete checkpoint, 0 when there is none.

    Only the marker counts: a `step-*` directory without it is an interrupted save. A marker
    whose directory lost its metadata falls back to the newest older complete one.
    """
    try:
        step = int(json.loads((root / MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
    dirs = step_dirs(root)
    for s in sorted((s for s in dirs if s <= step), reverse=True):
        if (dirs[s] / ".metadata").is_file():
            return s
    return 0


def write_marker(root: Path, step: int) -> float:
    """Commit `step` as the latest checkpoint; returns when it was saved (epoch s)."""
    saved_at = time.time()
    tmp = root / f".{MARKER}.tmp.{os.getpid()}"
    body = json.dumps({"step": step, "dir": f"step-{step}", "saved_at": saved_at})
    with open(tmp, "w") as f:
        f.write(body + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MARKER)
    _fsync_dir(root)
    return saved_at


def with_token(comment: str, key: str, value: str) -> str:
    """`comment` with `key=value` set: its own token replaced where it was, the others
    (train.sbatch's `injob=`, another tool's) kept. Slurm shows no comment as `(null)`."""
    tokens = [] if comment.strip() in ("", "(null)") else comment.split()
    mine = f"{key}={value}"
    out = [mine if t.partition("=")[0] == key else t for t in tokens]
    return " ".join(out if mine in out else [*out, mine])


# One read-modify-write of the Comment at a time within this process (ckpt_at, run_at, ...).
_comment_lock = threading.Lock()
_publishing: list[threading.Thread] = []


def shielded(argv: list[str]) -> list[str]:
    """`argv`, run with SIGUSR2 ignored: the runbook's SIGUSR2 reaches every process of the
    step (`scancel --signal=USR2`), and its default action would kill the `scontrol` that is
    writing `resumed_at=` right then: the runbook would never see the job step again and
    requeue a job that is training. A shell sets it (an ignored signal stays ignored across
    exec); a preexec_fn is not safe in a process with threads."""
    return ["sh", "-c", 'trap "" USR2; exec "$@"', "sh", *argv]


def publish(**tokens: str) -> None:
    """Set each `key=value` in the job's Slurm Comment (a field its owner may set), in one
    write: `ckpt_at`, when it last checkpointed, so whoever must take a node from running
    jobs (AutoClusters' GPU sharing lending a node to inference) picks the job that loses
    least work; `run_at`, when this run began its first step (the work a requeue would
    redo began at the later of the two); `resumed_at`, when it stepped again after an
    in-job restart or a requeue. Best effort, off the training thread: a slow or absent
    slurmctld never stalls a step. Outside Slurm (no SLURM_JOB_ID, or no scontrol/squeue)
    nothing is done."""
    job = os.environ.get("SLURM_JOB_ID")
    scontrol, squeue = shutil.which("scontrol"), shutil.which("squeue")
    if not job or not scontrol or not squeue:
        return

    def run() -> None:
        try:
            with _comment_lock:
                now = subprocess.run(
                    shielded([squeue, "-h", "-j", job, "-o", "%k"]),
                    capture_output=True, text=True, timeout=30, check=True,
                ).stdout.strip()  # fmt: skip
                for key, value in tokens.items():
                    now = with_token(now, key, value)
                comment = f"Comment={now}"
                subprocess.run(shielded([scontrol, "update", f"JobId={job}", comment]),
                               capture_output=True, timeout=30, check=False)  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass  # the next one tries again

    thread = threading.Thread(target=run, name=f"publish-{','.join(tokens)}", daemon=True)
    thread.start()
    _publishing[:] = [t for t in _publishing if t.is_alive()] + [thread]


def flush_published(timeout_s: float = 5) -> None:
    """Before exiting: a daemon thread dies with the process, and the ckpt_at of the save
    made on a signal is the one the runbook's checkpoint step waits for."""
    deadline = time.monotonic() + timeout_s
    for thread in _publishing:
        thread.join(max(0.0, deadline - time.monotonic()))


def publish_checkpoint(saved_at: float) -> None:
    # To the millisecond, as resumed_at: the runbook counts the work since the checkpoint
    # from it (estimated and measured), which a whole second would put up to 0.5 s off.
    publish(ckpt_at=f"{saved_at:.3f}")


class Checkpointer:
    """DCP saves with at most one in flight; rank 0 commits each by moving the marker.

    With no group (in-job mode, `rank` given), every rank holds the same state: rank 0 saves
    it alone and each rank loads it by itself (DCP's `no_dist`), so no checkpoint collective
    can block on a silent peer where the abort cannot reach it; the caller shares the
    resume point over the generation's group.
    """

    def __init__(
        self,
        root: Path,
        group: dist.ProcessGroup | None,
        use_async: bool,
        keep: int,
        rank: int | None = None,
    ):
        self.root = root
        self.group = group  # its own gloo group: the async save thread runs collectives
        self.use_async = use_async and hasattr(dcp, "async_save") and group is not None
        self.keep = keep
        self.rank = dist.get_rank() if rank is None else rank
        self.last_saved = 0
        self._pending: tuple[int, Future[Any], float] | None = None
        self._finished: dict[int, float] = {}

    def resume_point(self) -> int:
        """Agree on the latest complete checkpoint; rank 0 clears interrupted saves."""
        latest = [0]
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            latest[0] = read_marker(self.root)
            for s, path in step_dirs(self.root).items():
                if s > latest[0]:
                    shutil.rmtree(path, ignore_errors=True)
        if self.group is not None:
            dist.broadcast_object_list(latest, src=0, group=self.group)
        self.last_saved = latest[0]
        return latest[0]

    def load(self, step: int, model: nn.Module, optim: torch.optim.Optimizer) -> None:
        model_sd, optim_sd = get_state_dict(model, optim)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(self.root / f"step-{step}"),
                 process_group=self.group, no_dist=self.group is None)  # fmt: skip
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )

    def save(self, step: int, model: nn.Module, optim: torch.optim.Optimizer, block: bool) -> None:
        self.wait()
        if step <= self.last_saved:
            return
        if self.group is None and self.rank != 0:
            self.last_saved = step  # rank 0 writes the state every rank holds
            return
        model_sd, optim_sd = get_state_dict(model, optim)
        state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
        path = str(self.root / f"step-{step}")
        started = time.monotonic()
        if self.use_async and not block:
            res: Any = dcp.async_save(state, checkpoint_id=path, process_group=self.group)
            # torch >= 2.7 may return an AsyncSaveResponse; the upload future is the one.
            fut: Future[Any] = getattr(res, "upload_completion", res)
            # Noted when the writer finishes, not when the loop next looks: save_s is honest.
            fut.add_done_callback(lambda _f: self._finished.setdefault(step, time.monotonic()))
            self._pending = (step, fut, started)
            self._event("checkpoint_started", step, stall_s=time.monotonic() - started)
        else:
            dcp.save(state, checkpoint_id=path, process_group=self.group,
                     no_dist=self.group is None)  # fmt: skip
            self._commit(step, started)

    def poll(self) -> None:
        if self._pending and self._pending[1].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        step, fut, started = self._pending
        self._pending = None
        try:
            fut.result()
        except Exception as e:  # a failed save leaves the marker where it was
            self._event("checkpoint_failed", step, error=repr(e))
            return
        self._commit(step, started)

    def _commit(self, step: int, started: float) -> None:
        # DCP's save returns on every rank only after the coordinator wrote .metadata,
        # which it does after gathering every rank's write results: the save is complete.
        self.last_saved = step
        finished = self._finished.pop(step, time.monotonic())
        if self.rank != 0:
            return
        publish_checkpoint(write_marker(self.root, step))
        self._event("checkpoint_saved", step, save_s=finished - started)
        older = sorted(s for s in step_dirs(self.root) if s < step)
        for s in older[: max(0, len(older) - (self.keep - 1))]:
            shutil.rmtree(self.root / f"step-{s}", ignore_errors=True)

    def _event(self, name: str, step: int, **fields: object) -> None:
        if self.rank == 0:
            extra = " ".join(
                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items()
            )
            emit(f"{_prefix()} event={name} ckpt_step={step} {extra}".rstrip())


def emit(line: str) -> None:
    # One write per line: ranks (and nodes) share one output file, and a single short
    # write to a pipe or an O_APPEND file is not interleaved with another.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _prefix() -> str:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    restart = os.environ.get("SLURM_RESTART_COUNT") or "0"
    return f"ts={time.time():.3f} node={node} restart={restart}"


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 1))


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (seed, step, rank) always gives the same batch, across restarts."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    x = torch.randn(size, DIM, generator=g)
    teacher = torch.Generator().manual_seed(seed)
    w = torch.randn(DIM, 1, generator=teacher) / DIM**0.5
    return x, torch.sin(3 * x @ w)


def die_with_agent() -> None:
    """Under torchrun, die when the agent dies.

    torchrun starts each rank in a session of its own: a SIGKILLed agent (OOM killer, a
    node-local kill) would leave orphan ranks that hold the GPUs the requeued job needs.
    """
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() == 1:  # the agent was already gone before prctl took effect
        os._exit(1)


class Trainer:
    """The training loop of one formed group: the torchrun launch's only group, or one
    generation of the in-place mode. `completed` is the last step every rank finished (its
    all-reduces done and the optimizer stepped), kept when a collective fails."""

    def __init__(
        self,
        args: argparse.Namespace,
        module: nn.Module,
        optim: torch.optim.Optimizer,
        device: torch.device,
        stop: StopRequest,
        local_rank: int,
    ) -> None:
        self.args, self.module, self.optim, self.device = args, module, optim, device
        self.stop, self.local_rank = stop, local_rank
        self.completed = 0

    def run(self, comm: Generation | None = None, training: tuple[str, ...] = ()) -> int:
        """Train from the latest checkpoint (a formed in-place generation: from rank 0's state
        in memory when it is newer) until the steps are done (0) or a signal (128+sig). In
        place (`comm`), a generation that is abandoned or whose collective fails raises
        GroupLost; under torchrun a failed collective raises."""
        args, device = self.args, self.device
        gen = None if comm is None else comm.gen
        if comm is None:
            rank, world = dist.get_rank(), dist.get_world_size()
            cuda = device.type == "cuda"
            model: nn.Module = DistributedDataParallel(
                self.module, device_ids=[self.local_rank] if cuda else None
            )  # its construction broadcasts rank 0's parameters
            ckpt_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.timeout))
            ckpt = Checkpointer(args.ckpt_dir, ckpt_group, not args.sync_save, args.keep)
            resumed_from = ckpt.resume_point()
            started = time.monotonic()
            if resumed_from:
                ckpt.load(resumed_from, model, self.optim)
                ckpt._event("resumed", resumed_from, load_s=time.monotonic() - started)
        else:
            rank, world, model = comm.rank, comm.world, self.module
            # Synchronous saves by rank 0 alone: an async save's thread would outlive an
            # abandoned generation, and a checkpoint collective could block on a silent peer.
            ckpt = Checkpointer(args.ckpt_dir, None, False, args.keep, rank=rank)
            resumed_from = self._start_generation(comm, ckpt)
        elastic = "" if gen is None else f" elastic={gen}"
        # A run Slurm started again (a requeue): its first step says when it stepped again.
        restarted = (os.environ.get("SLURM_RESTART_COUNT") or "0") != "0"
        PROGRESS.regroup(rank=rank, world=world, generation=gen or 0)
        logs = {"all": True, "node": self.local_rank == 0, "zero": rank == 0}[args.log_ranks]
        step = self.completed = resumed_from
        began = time.time()  # the work this run does from its checkpoint (or none) on
        while not args.steps or step < args.steps:
            step += 1
            if step == args.data_stall_at and rank == 0:
                # A slow data loader: not a declared pause, the others wait for this rank
                # inside the step's collective (the agent must not take it for a hang).
                self.stop.sleep(args.data_stall_s)
            x, y = batch(args.seed, step, rank, args.batch)
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            self.optim.zero_grad(set_to_none=True)
            loss.backward()
            # One small all-reduce per step (in place: with the gradients): the mean loss,
            # and whether any rank was signalled, so that every rank stops (and saves) at the
            # same step. Before the optimizer step: a step is applied only once every
            # collective of it succeeded.
            stats = torch.tensor([loss.item(), float(self.stop.signum)], device=device)
            with PROGRESS.collective("all_reduce"):
                if comm is None:
                    dist.all_reduce(stats)
                else:
                    stats = self._all_reduce_grads(comm, stats)
            self.optim.step()
            self.completed = step
            self.stop.stepped()
            PROGRESS.step(step)
            if logs:
                emit(
                    f"{_prefix()} step={step} rank={rank} resumed_from={resumed_from} "
                    f"loss={stats[0].item() / world:.6f}{elastic}"
                )
            if rank == 0 and step == resumed_from + 1:
                # Who trains (a standby's loss needs no re-forming), then that it steps:
                # the runbook waits for resumed_at after it took a training node, and
                # reads it after a requeue to measure what the fault cost the job. Where
                # a run (not a re-formed generation, which kept its state) began its
                # first step is where the work a requeue would redo begins when the run
                # started from an older checkpoint, or from none (run_at).
                said = {"run_at": f"{began:.3f}"} if not gen else {}
                if gen is not None:
                    said["training"] = ",".join(training)
                if gen is not None or restarted:
                    said["resumed_at"] = f"{time.time():.3f}"
                publish(**said)
            ckpt.poll()
            if stats[1].item() > 0:
                with self.stop.saving():
                    ckpt.save(step, model, self.optim, block=True)
                    ckpt._event("stopped", step, signal=signal.Signals(self.stop.signum or 15).name)
                    ckpt.wait()
                return 128 + (self.stop.signum or signal.SIGTERM)
            if step % args.ckpt_every == 0:
                with PROGRESS.paused("checkpoint"):
                    ckpt.save(step, model, self.optim, block=False)
            if args.eval_every and step % args.eval_every == 0:
                with PROGRESS.paused("evaluation"):  # every rank, declared: not a hang
                    self.stop.sleep(args.eval_s)
            self.stop.work(args.step_sleep)
        with self.stop.saving():
            ckpt.save(step, model, self.optim, block=True)
            ckpt.wait()
        return 0

    def _all_reduce_grads(self, comm: Generation, stats: torch.Tensor) -> torch.Tensor:
        """The gradients' mean and `stats`' sum over the generation, in one collective that
        the abort can leave (DDP's reducer waits for its all-reduces inside backward())."""
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        flat = torch.cat([*(g.reshape(-1) for g in grads), stats])
        comm.allreduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g) / comm.world)
            offset += g.numel()
        return flat[offset:]

    def _start_generation(self, comm: Generation, ckpt: Checkpointer) -> int:
        """Every rank of the generation takes rank 0's state: from its memory when it is at
        least as new as the latest checkpoint (a re-forming, or a fresh start), else from
        that checkpoint. Returns the step it is at."""
        started = time.monotonic()
        marker = ckpt.resume_point()  # rank 0's; the others learn it below
        blob = b""
        if comm.rank == 0 and self.completed >= marker:
            buf = io.BytesIO()
            torch.save({"model": self.module.state_dict(), "optim": self.optim.state_dict()}, buf)
            blob = buf.getvalue()
        head = torch.tensor([marker, self.completed, len(blob)], dtype=torch.int64)
        comm.broadcast(head)
        marker, peer, size = (int(v) for v in head)
        ckpt.last_saved = marker
        if size == 0:
            ckpt.load(marker, self.module, self.optim)
            ckpt._event("resumed", marker, load_s=time.monotonic() - started)
            self.completed = marker
            return marker
        data = bytearray(blob) if comm.rank == 0 else bytearray(size)
        comm.broadcast(torch.frombuffer(data, dtype=torch.uint8))  # into `data`
        if comm.rank != 0:
            state = torch.load(io.BytesIO(data), weights_only=True)
            self.module.load_state_dict(state["model"])
            self.optim.load_state_dict(state["optim"])
        self.completed = peer
        if peer:
            ckpt._event("resumed", peer, load_s=time.monotonic() - started, source="peer")
        return peer


def _device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def _warm_up(optim_of: Any) -> None:
    """Import what a first optimizer step imports (torch._dynamo, 0.5-1 s on CPU) now, so a
    standby's first step after taking a seat does not."""
    scratch = make_model(0)
    opt = optim_of(scratch)
    scratch(torch.zeros(1, DIM)).sum().backward()
    opt.step()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_agent()
    # Before the rendezvous: a signal then must not kill a rank mid-save.
    stop = StopRequest(args.term_grace, args.stuck_grace)
    torch.set_num_threads(args.threads)
    if args.in_place:
        return main_in_place(args, stop)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _device(local_rank)
    dist.init_process_group(_backend(device), timeout=timedelta(seconds=args.timeout))
    module = make_model(args.seed).to(device)
    optim = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    rc = Trainer(args, module, optim, device, stop, local_rank).run(None)
    dist.destroy_process_group()
    flush_published()
    return rc


def main_in_place(args: argparse.Namespace, stop: StopRequest) -> int:
    """In-job mode (in_place.py): stand by or train, generation after generation."""
    from in_place import AbortRequest, Generation, GroupLost, InPlaceGroup, NoGeneration

    abort = AbortRequest(args.abort_grace)  # SIGUSR2: before anything may block

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    children = _start_local_ranks(args.nproc_per_node) if local_rank == 0 else []
    job = f"{os.environ.get('SLURM_JOB_ID', 'local')}.{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    device = _device(local_rank)

    def sgd(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=args.lr, momentum=0.9)

    module = make_model(args.seed).to(device)
    optim = sgd(module)
    _warm_up(sgd)
    trainer = Trainer(args, module, optim, device, stop, local_rank)
    group = InPlaceGroup(
        args.in_place, job, node, local_rank, args.nproc_per_node, args.train_nodes,
        args.join_timeout, lambda: bool(stop.signum),
    )  # fmt: skip
    try:
        while (seat := group.seat(trainer.completed)) is not None:
            if seat.gen > args.max_restarts:
                raise NoGeneration(f"{seat.gen} groups formed: restarts used up")
            try:
                # The generation's own gloo group (on GPUs the same steps hold for NCCL:
                # in_place.Generation says how). Not init_process_group: the default group
                # cannot be left without destroying it, which blocks on a silent peer.
                rc = trainer.run(Generation(group, seat, args.timeout, abort), seat.nodes)
            except GroupLost as e:  # a peer hangs or is gone: the next generation
                emit(f"{_prefix()} event=group_failed gen={seat.gen} reason={e.reason}"
                     f"{f' error={e.error}' if e.error else ''}")  # fmt: skip
                group.fail()
                continue
            if rc == 0 and seat.rank == 0:
                # train.sbatch requeues an in-job run whose srun failed unless this is here.
                (args.ckpt_dir / "done").write_text(f"{trainer.completed}\n")
                group.finish()
            flush_published()
            return rc
        if not stop.signum and group.gave_up():
            emit(f"{_prefix()} event=in_job_failed error=another process gave up")
            return 1
    except NoGeneration as e:
        emit(f"{_prefix()} event=in_job_failed error={e}")
        group.give_up()  # the standbys stop too: the run ends, and is requeued
        return 1
    finally:
        for child in children:
            child.wait()
    flush_published()
    return 128 + stop.signum if stop.signum else 0


def _start_local_ranks(nproc: int) -> list[subprocess.Popen[bytes]]:
    """In-job mode, several ranks per node: this process (srun's one task on the node, whose
    PID the runbook kills) is local rank 0 and starts the others, which die with it."""

    def die_with_parent() -> None:
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG

    return [
        subprocess.Popen(
            [sys.executable, *sys.argv],
            env={**os.environ, "LOCAL_RANK": str(i)},
            preexec_fn=die_with_parent,  # noqa: PLW1509  # before any thread starts
        )
        for i in range(1, nproc)
    ]


if __name__ == "__main__":
    rc = main()
    PROGRESS.close()  # os._exit below skips atexit: a rank that ended leaves no file
    # Exit without the interpreter's teardown: with torch loaded it takes seconds (2-4 s
    # measured on a loaded 2-core node), and on a requeue Slurm waits for every process
    # of the old run before the job may start again. Nothing is left to tear down: the
    # last checkpoint is saved and committed, its ckpt_at published, the group destroyed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
