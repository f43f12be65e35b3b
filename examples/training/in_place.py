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
- **Fail.** A collective that fails (a peer's process died: gloo sees its sockets close at
  once) opens generation g+1 (`g<g+1>/open`), whose first opener leads it; every live process
  joins it. A standby wakes within `POLL_S`.

What torchrun's elastic restart costs and this does not: waiting for the lost agent's
keep-alives to go stale (3 s with 1 s x 3), the rendezvous' fixed 1 s polling, and every
rank's new process importing torch again (2-3 s on CPU). A process that cannot go on (no
generation forms within the join timeout, the store is gone) exits non-zero; the batch shell
then requeues the job, which resumes from its shared checkpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

POLL_S = 0.02  # how often a waiting process looks at the store: a standby's wake-up delay


@dataclass(frozen=True)
class Seat:
    """This process's place in a formed generation."""

    gen: int
    rank: int
    world: int
    nodes: tuple[str, ...]  # the generation's training nodes, rank order


class NoGeneration(Exception):
    """No generation formed within the join timeout: in-job recovery gives up."""


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
        """The group failed: open the next generation (leading it if first) and leave this
        one's process groups."""
        nxt = self.gen + 1
        self.lead = self.store.add(self._k(nxt, "opened"), 1) == 1
        self.store.set(self._k(nxt, "open"), "1")
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001  # a half-dead group: nothing left to release
            pass
        self.gen = nxt

    def finish(self) -> None:
        """The run is done: the standbys stop waiting."""
        self.store.set(self._k("finished"), "1")

    def process_group_store(self) -> dist.Store:
        return dist.PrefixStore(self._k(self.gen, "pg") + "/", self.store)

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
