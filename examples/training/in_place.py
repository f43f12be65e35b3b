"""In-job recovery in place: the job's own processes re-form their group without a lost node,
a standby process taking its seat, with no process restarted and nothing imported again.

train.sbatch's in-job mode (`SPARES=1`) starts one process per node per GPU (`srun`, no
torchrun); `--train-nodes` of the nodes train, the others' processes wait as standbys. They
meet in the batch shell's TCPStore (rdzv_store.py), under `inplace/<job>/`, in numbered
generations:

- **Join.** Each live process adds itself to generation g (`g<g>/joined`, `g<g>/member/<n>`:
  its node, local rank and the last step it completed).
- **Plan.** The generation's leader (generation 0: the first process to start; later: the
  first to see the group fail) waits until `train_nodes` nodes have all their processes in,
  picks them (the most advanced state first: survivors before standbys) and writes
  `g<g>/plan`, every seated process's rank. Rank 0 is a process holding the newest state.
- **Train.** Seated processes form the process group on `g<g>/pg/` and take rank 0's state
  (DDP broadcasts the parameters, the optimizer state follows); the others wait for
  generation g+1 to open.
- **Abandon.** A generation is left, by the first of its ranks to see one of these, and
  every other rank follows within `SLICE_S`:
  - the runbook's SIGUSR2 (`scancel --signal=USR2 <job>`, to the job's steps, sent once it
    released the faulty node from the job): the victim hangs with its connections open
    (Xid 79: stuck in the driver; a node without power closes nothing), so its peers would
    wait in the collective until its timeout;
  - a collective that fails (a peer's process died: gloo sees its sockets close at once);
  - another rank opened the next generation (the key below);
  - the collective timeout (`--timeout`, 120 s): the last resort of a run with no runbook.
  It opens generation g+1 (`g<g+1>/open`), whose first opener leads it; every live process
  joins it. A standby wakes within `POLL_S`; a SIGUSR2 to a standby changes nothing.

Every collective of a generation is issued async on that generation's own gloo group and
waited for in slices (`Generation`), so that the main thread sees the signal and the store
while a peer is silent. The old group is abandoned, never destroyed: see `Generation`.

What torchrun's elastic restart costs and this does not: waiting for the lost agent's
keep-alives to go stale (3 s with 1 s x 3), the rendezvous' fixed 1 s polling, and every
rank's new process importing torch again (2-3 s on CPU). A process that cannot go on (no
generation forms within the join timeout, the store is gone) exits non-zero; the batch shell
then requeues the job, which resumes from its shared checkpoint.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

POLL_S = 0.02  # how often a waiting process looks at the store: a standby's wake-up delay
# How often a rank waiting on a collective (or on its group's forming) looks at the abort
# flag and at the store: the most a survivor adds to the runbook's signal, besides the grace.
SLICE_S = 0.05
ABORT_SIGNAL = signal.SIGUSR2
GAVE_UP = "gave_up"  # the `finished` key's value when the run cannot go on in place

# Every generation's gloo group and the last thread that used it, held until the process
# exits: never destroyed, never collected (Generation says why).
_ABANDONED: list[Any] = []


@dataclass(frozen=True)
class Seat:
    """This process's place in a formed generation."""

    gen: int
    rank: int
    world: int
    nodes: tuple[str, ...]  # the generation's training nodes, rank order


class NoGeneration(Exception):
    """No generation formed within the join timeout: in-job recovery gives up."""


class GroupLost(Exception):
    """This generation is abandoned: `reason` is signal (the runbook's SIGUSR2), peer (another
    rank opened the next generation), timeout, or error (a collective failed: `error`)."""

    def __init__(self, reason: str, error: str = "") -> None:
        super().__init__(f"{reason} {error}".strip())
        self.reason, self.error = reason, error


class AbortRequest:
    """The runbook's SIGUSR2: abandon the generation, whose collective is stuck on a peer.

    The signal abandons a generation only once a collective has waited `grace_s` past both
    its start and the signal, and a collective issued after the signal that completes
    dismisses it: a signal that arrives late (after this process already followed another
    rank into the next generation, or after a crashed peer's closed sockets made the group
    re-form before the runbook released the node), or to a standby that is then seated,
    never abandons a healthy generation. One signal abandons one generation: the
    abandonment spends it, and a generation that begins forming after it dismisses it, so
    the next generation's forming, which may take longer than `grace_s` on a loaded
    machine, is not abandoned by the same signal (it was, ten generations in a row under a
    load of 25). The handler runs on the main thread between
    bytecodes, which `Generation` gives it by waiting in slices.
    """

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.at = 0.0  # time.monotonic() of the pending signal; 0: none
        signal.signal(ABORT_SIGNAL, self._handle)

    def _handle(self, _signum: int, _frame: object) -> None:
        self.at = time.monotonic()

    def abandons(self, since: float, now: float) -> bool:
        """Does the pending signal abandon a wait that began at `since`? If so it is spent."""
        if self.at > 0 and now - max(since, self.at) >= self.grace_s:
            self.at = 0.0
            return True
        return False

    def healthy(self, started: float) -> None:
        """A collective started at `started` completed: a signal before it is dismissed."""
        if 0 < self.at <= started:
            self.at = 0.0


class InPlaceGroup:
    """One process's membership in the job's generations.

    Args:
        store: `host:port` of the job's TCPStore.
        job: the Slurm job id (the store's keys are the job's own).
        node: this process's node; local_rank, nproc: its place among the node's processes.
        train_nodes: how many nodes train at once.
        join_timeout_s: how long a generation may take to form.
        stopped: True once the process was told to stop (SIGTERM, SIGUSR1): a wait ends.
    """

    def __init__(
        self,
        store: str,
        job: str,
        node: str,
        local_rank: int,
        nproc: int,
        train_nodes: int,
        join_timeout_s: float,
        stopped: Callable[[], bool],
    ) -> None:
        host, port = store.rsplit(":", 1)
        self.store_addr = (host, int(port))
        self.store = dist.TCPStore(
            host, int(port), is_master=False, timeout=timedelta(seconds=join_timeout_s)
        )
        self.prefix = f"inplace/{job}"
        self.me = f"{node}:{local_rank}"
        self.node, self.nproc, self.train_nodes = node, nproc, train_nodes
        self.join_timeout_s = join_timeout_s
        self.stopped = stopped
        self.gen = 0
        # Generation 0's leader is whoever starts first; later ones, the first to fail.
        self.lead = self.store.add(self._k(0, "opened"), 1) == 1
        # A standby started later (in a holder job, train.sbatch HOLDERS=1) joins the newest
        # generation, not the first: on a repaired node its name may be seated in an old
        # plan, whose abandoned group it must not try to form.
        while not self.lead and self._has(self._k(self.gen + 1, "open")):
            self.gen += 1

    def _k(self, *parts: object) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def seat(self, completed: int) -> Seat | None:
        """Join generations until one seats this process; None once the run finished (or
        this process was told to stop) while it stood by."""
        while True:
            seat = self._join(completed)
            if seat is not None:
                return seat
            self.gen, self.lead = self.gen + 1, False
            if not self._until(lambda: self._has(self._k(self.gen, "open")), forever=True):
                return None

    def fail(self) -> None:
        """The group failed or was abandoned: open the next generation (leading it if first).
        The old generation's group is left as it is (Generation)."""
        nxt = self.gen + 1
        self.lead = self.store.add(self._k(nxt, "opened"), 1) == 1
        self.store.set(self._k(nxt, "open"), "1")
        self.gen = nxt

    def next_open(self) -> bool:
        """Another rank abandoned this generation."""
        return self._has(self._k(self.gen + 1, "open"))

    def finish(self) -> None:
        """The run is done: the standbys stop waiting."""
        self.store.set(self._k("finished"), "1")

    def give_up(self) -> None:
        """In-job recovery cannot go on (NoGeneration): the standbys stop waiting too, and
        exit non-zero, so that the run ends and its batch shell requeues the job. A standby
        that is seated in no generation would otherwise wait for the next one forever, and
        the shell for it (train.sbatch waits for the processes it started into holders)."""
        self.store.set(self._k("finished"), GAVE_UP)

    def gave_up(self) -> bool:
        """Another process of the run gave up (`give_up`)."""
        key = self._k("finished")
        return self._has(key) and self.store.get(key) == GAVE_UP.encode()

    def process_group_store(self) -> dist.Store:
        """The generation's group's store: a connection of its own, so that the main thread's
        look at the store (`next_open`) never queues behind the group's forming in another
        thread, which waits there for its peers."""
        addr = self.store_addr
        own = dist.TCPStore(addr[0], addr[1], is_master=False,
                            timeout=timedelta(seconds=self.join_timeout_s))  # fmt: skip
        return dist.PrefixStore(self._k(self.gen, "pg") + "/", own)

    # --- one generation ---------------------------------------------------------------------

    def _join(self, completed: int) -> Seat | None:
        gen = self.gen
        n = self.store.add(self._k(gen, "joined"), 1)
        member = {"who": self.me, "node": self.node, "completed": completed}
        self.store.set(self._k(gen, "member", n), json.dumps(member))
        if self.lead:
            self._plan(gen)
        plan_key = self._k(gen, "plan")
        if not self._until(lambda: self._has(plan_key)):
            return None
        plan = json.loads(self.store.get(plan_key))
        ranks: dict[str, int] = plan["ranks"]
        rank = ranks.get(self.me)
        in_rank_order = sorted(ranks, key=lambda who: ranks[who])
        nodes = tuple(dict.fromkeys(who.rsplit(":", 1)[0] for who in in_rank_order))
        return None if rank is None else Seat(gen, rank, plan["world"], nodes)

    def _plan(self, gen: int) -> None:
        """Seat `train_nodes` whole nodes, the most advanced first, once enough have joined."""
        members: list[dict[str, object]] = []

        def enough() -> bool:
            joined = self.store.add(self._k(gen, "joined"), 0)
            members.extend(
                json.loads(self.store.get(self._k(gen, "member", i)))
                for i in range(len(members) + 1, joined + 1)
            )
            return len(_whole_nodes(members, self.nproc)) >= self.train_nodes

        if not self._until(enough):
            raise NoGeneration(f"generation {gen}: fewer than {self.train_nodes} nodes joined")
        nodes = _whole_nodes(members, self.nproc)
        chosen = sorted(nodes, key=lambda n: (-nodes[n], n))[: self.train_nodes]
        ranks = {f"{n}:{local}": i * self.nproc + local for i, n in enumerate(chosen)
                 for local in range(self.nproc)}  # fmt: skip
        plan = {"world": len(ranks), "ranks": ranks}
        self.store.set(self._k(gen, "plan"), json.dumps(plan))

    # --- waiting ----------------------------------------------------------------------------

    def _has(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def _until(self, ready: Callable[[], bool], *, forever: bool = False) -> bool:
        """Poll until `ready`; False when the run finished or this process must stop. Without
        `forever`, a wait past the join timeout raises NoGeneration."""
        deadline = time.monotonic() + self.join_timeout_s
        while not ready():
            if self.stopped() or self._has(self._k("finished")):
                return False
            if not forever and time.monotonic() > deadline:
                raise NoGeneration(f"generation {self.gen} did not form in time")
            time.sleep(POLL_S)
        return True


def _whole_nodes(members: list[dict[str, object]], nproc: int) -> dict[str, int]:
    """The nodes all of whose processes joined, with the newest step any of them completed."""
    procs: dict[str, set[str]] = {}
    newest: dict[str, int] = {}
    for m in members:
        node = str(m["node"])
        procs.setdefault(node, set()).add(str(m["who"]))
        newest[node] = max(newest.get(node, 0), int(m["completed"]))  # type: ignore[call-overload]
    return {n: newest[n] for n, who in procs.items() if len(who) >= nproc}


class Generation:
    """This process's seat in one formed generation, and the generation's own gloo group.

    Each generation builds its own `ProcessGroupGloo` on its own prefix of the job's store
    (`g<g>/pg/`), not the default group of `init_process_group`, and when it is abandoned the
    group is left as it is, held in `_ABANDONED` until the process exits: its worker thread
    is blocked in a collective on the silent peer, and destroying the group
    (`destroy_process_group`, `_abort_process_group`, or dropping the last reference, whose
    destructor joins that thread) blocks until the collective's timeout; gloo's `abort()`
    does not unblock it. Measured on torch 2.13 CPU: `destroy_process_group` with one peer
    SIGSTOPped took the whole 20 s timeout. A few leaked sockets and threads per re-forming
    (at most `--max-restarts`) are the price.

    Every collective is issued async and waited for in `SLICE_S` slices, between which the
    main thread runs the SIGUSR2 handler and looks at the store; nothing of the generation
    (its forming, the state's broadcast, checkpoints: rank 0 writes them alone) blocks where
    the abort cannot reach it.

    The same under NCCL, on GPUs (this example's CPU run cannot show it):
    - Collectives are async there anyway: the kernel is queued on the GPU and the host
      blocks only where it reads a result or synchronizes. Wait by polling
      `work.is_completed()` (a CUDA event query) between checks of the abort flag, as here,
      never in `work.wait()` plus `.item()`/`cuda.synchronize()` on a stuck kernel.
    - Abandon with `ProcessGroupNCCL.abort()` (torch >= 2.6; `_shutdown()` before), or
      `torch.distributed.distributed_c10d._abort_process_group()` for every group at once:
      `ncclCommAbort` stops the survivors' kernels that wait for the dead GPU and frees
      the communicator without a collective handshake; `destroy_process_group` and
      `ncclCommDestroy` can hang on the dead peer like gloo's teardown here. A communicator
      made non-blocking (`ProcessGroupNCCL.Options().config.blocking = False`) keeps the
      abort itself from blocking. The next generation is a new communicator, its unique id
      exchanged through a new store prefix as `g<g>/pg/` here. What the aborted kernels
      wrote is garbage: the optimizer step applies only after every collective of the
      step succeeded, as here.
    - `TORCH_NCCL_ASYNC_ERROR_HANDLING`: the watchdog thread's reaction to a failed or
      timed-out collective. Its default (3) and 1 tear the whole process down, the opposite
      of recovering in it; in-process recovery sets 0 (no handling: the application aborts,
      as `_abort_process_group`'s docs require) or 2 (the watchdog aborts the communicator,
      the process lives and the work raises). The group's timeout is the watchdog's
      deadline: keep it (and `TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`, after which the watchdog's
      monitor kills a process whose watchdog is stuck) longer than this job's own last
      resort (`--timeout`), as NVRx asks of its hard timeout.
    - NVIDIA's NVRx in-process restart (`nvidia_resiliency_ext.inprocess.Wrapper`) does
      these steps for a wrapped training function: a monitor thread in each rank notices a
      fault (an exception on any rank, shared through the store, or no progress within the
      soft timeout), calls `AbortTorchDistributed` (each group's NCCL backend `abort()`ed
      from a thread of its own, then `destroy_process_group`), raises an exception into the
      main thread, and all healthy ranks meet at a store barrier, are given new ranks
      (reserve ranks filling the gaps) and call the function again in the same processes. A
      rank it cannot unblock is killed by the hard timeout (SIGCONT, SIGTERM, SIGKILL) and
      left out. Here, the runbook's SIGUSR2 and the generations play those parts.
    - TorchFT: every step a quorum from its lighthouse; its reconfigurable process groups
      abort the old communicator and build a new one on a new store prefix per quorum (its
      NCCL group puts its own timeout in front of the watchdog and aborts instead of
      crashing; `ProcessGroupBabyNCCL` runs NCCL in a child process that can simply be
      killed); a failed allreduce makes `should_commit()` drop the step, and a recovering
      replica takes the state from a healthy peer, as a standby takes rank 0's here.
    """

    def __init__(
        self, group: InPlaceGroup, seat: Seat, timeout_s: float, abort: AbortRequest
    ) -> None:
        self.group, self.seat, self.timeout_s, self.abort = group, seat, timeout_s, abort
        self.gen, self.rank, self.world = seat.gen, seat.rank, seat.world
        store = group.process_group_store()
        built: list[Any] = []
        done = threading.Event()

        def build() -> None:  # connects to every peer: blocks while one is silent
            try:
                pg = dist.ProcessGroupGloo(store, seat.rank, seat.world,
                                           timedelta(seconds=timeout_s))  # fmt: skip
                _ABANDONED.append(pg)  # held even when the main thread gave up waiting
                built.append(pg)
            except Exception as e:  # noqa: BLE001  # reported by the main thread below
                built.append(e)
            done.set()

        thread = threading.Thread(target=build, name=f"gen{seat.gen}-group", daemon=True)
        _ABANDONED.append((store, thread))
        started = time.monotonic()
        # A signal from before this generation was for one this process has left (or, to a
        # standby, for the one it was seated to replace): the seats of this one leave the
        # stuck peer out, so its forming is not what the signal was about.
        abort.healthy(started)
        thread.start()
        self._wait(done, started)
        if isinstance(built[0], Exception):
            raise GroupLost("error", type(built[0]).__name__)
        self.pg = built[0]

    def allreduce(self, tensor: torch.Tensor) -> None:
        """Sum `tensor` over the generation, in place."""
        self._run(self.pg.allreduce([tensor]))

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` on every rank, in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._run(self.pg.broadcast([tensor], opts))

    def _run(self, work: Any) -> None:
        started = time.monotonic()
        done = threading.Event()
        work.get_future().add_done_callback(lambda _f: done.set())
        self._wait(done, started)
        try:
            work.wait()  # raises what failed it: a peer's closed sockets, gloo's timeout
        except Exception as e:  # noqa: BLE001  # gloo raises RuntimeError or DistError
            raise GroupLost("error", type(e).__name__) from e
        self.abort.healthy(started)

    def _wait(self, done: threading.Event, started: float) -> None:
        while not done.wait(SLICE_S):
            now = time.monotonic()
            if self.abort.abandons(started, now):
                raise GroupLost("signal")
            if self.group.next_open():
                raise GroupLost("peer")
            if now - started > self.timeout_s:
                raise GroupLost("timeout")
