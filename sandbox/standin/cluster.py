"""A Slurm cluster and its cloud in memory, for a scale benchmark: thousands of nodes
where the sandbox can run only a handful of real slurmd.

It keeps what the activities rely on, as tests/fakes/systems.py does for the workflow tests:
`scontrol` refuses to resume a node that is not drained and to requeue a job that is not
running; a requeued job waits PENDING (BeginTime) until its hold is released, then starts
again on idle nodes; a reboot takes the machine down (NOT_RESPONDING, its jobs die) and
brings it back after `boot_delay_s` with a new slurmd start time and a new boot id.

Synchronous and single-threaded: `sandbox/standin/server.py` serves it over HTTP to every
worker process, so all of them see one cluster.
"""

from __future__ import annotations

import itertools
import time
import uuid
from dataclasses import dataclass, field

from autoclusters.core import hostlist
from autoclusters.core.models import SlurmJob, SlurmNode
from autoclusters.core.policy import Rung
from autoclusters.integrations.slurm import SlurmError

ACTIVE = {"RUNNING", "CONFIGURING", "SUSPENDED"}
GPUS_PER_NODE = 8


class StandInError(SlurmError):
    """What scontrol would refuse, in its words."""


@dataclass
class Machine:
    vm_id: str
    boot_id: str
    up_at: float | None  # when it finished booting (None: down, booting)


@dataclass
class Repair:
    node: str
    rung: Rung
    old_vm_id: str
    new_vm_id: str
    stopped_at: float | None


@dataclass
class StandInCluster:
    """`nodes` named gpu-0001...; `job_nodes`-node jobs over the first nodes (one job per
    `job_nodes` nodes, `busy_fraction` of the cluster busy)."""

    size: int
    boot_delay_s: float = 1.0
    job_nodes: int = 8
    busy_fraction: float = 0.5
    nodes: dict[str, SlurmNode] = field(default_factory=dict)
    jobs: dict[int, SlurmJob] = field(default_factory=dict)
    machines: dict[str, Machine] = field(default_factory=dict)
    repairs: dict[str, Repair] = field(default_factory=dict)  # by idempotency key
    released_at: dict[int, float] = field(default_factory=dict)  # job -> hold released
    booted: list[str] = field(default_factory=list)  # machines back up, for the agents
    booting: dict[str, float] = field(default_factory=dict)  # node -> powered off at
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def __post_init__(self) -> None:
        now = int(time.time())
        for i in range(1, self.size + 1):
            name = node_name(i)
            self.nodes[name] = SlurmNode(
                name=name, state="idle", slurmd_start_time=now, gres=f"gpu:{GPUS_PER_NODE}"
            )
            self.machines[name] = Machine(f"vm-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex, now)
        busy = int(self.size * self.busy_fraction) // self.job_nodes * self.job_nodes
        for start in range(1, busy + 1, self.job_nodes):
            names = [node_name(i) for i in range(start, start + self.job_nodes)]
            self._start(self._new_job(), names)

    # --- what the clients call ---------------------------------------------------------

    def node_list(self) -> list[SlurmNode]:
        self._tick()
        return list(self.nodes.values())

    def node(self, name: str) -> SlurmNode | None:
        self._tick()
        return self.nodes.get(name)

    def job_list(self, node: str | None = None) -> list[SlurmJob]:
        self._tick()
        if node is None:
            return list(self.jobs.values())
        return [j for j in self.jobs.values() if node in hostlist.expand(j.nodes)]

    def drain(self, node: str, reason: str) -> None:
        n = self._node(node)
        if not reason:
            raise StandInError("scontrol update: you must specify a reason when DRAINING")
        if "DRAIN" not in n.state_flags:
            n.state_flags.append("DRAIN")
        n.reason = reason

    def resume(self, node: str) -> None:
        n = self._node(node)
        if "DRAIN" not in n.state_flags:
            raise StandInError(f"scontrol update NodeName={node}: Invalid node state specified")
        n.state_flags.remove("DRAIN")
        n.reason = ""

    def requeue(self, job_id: int) -> None:
        job = self._job(job_id)
        if job.job_state not in ACTIVE or not job.requeue:
            raise StandInError(f"scontrol requeue {job_id}: Job is pending execution")
        nodes = hostlist.expand(job.nodes)
        job.job_state, job.state_reason, job.nodes = "PENDING", "BeginTime", ""
        job.restart_cnt += 1
        self._settle(nodes)

    def release_hold(self, job_id: int) -> None:
        job = self._job(job_id)
        if job.job_state == "PENDING":
            job.state_reason = "Resources"
            self.released_at[job_id] = time.time()

    def set_admin_comment(self, job_id: int, text: str) -> None:
        self._job(job_id).admin_comment = text

    def cancel(self, job_id: int) -> None:
        job = self._job(job_id)
        nodes = hostlist.expand(job.nodes)
        job.job_state = "CANCELLED"
        self._settle(nodes)

    def vm_id(self, node: str) -> str:
        self._node(node)
        return self.machines[node].vm_id

    def repair(self, node: str, rung: Rung, key: str) -> Repair:
        """Reset the GPUs (the machine stays up), or power-cycle or replace the machine;
        the same key answers the same repair (a retried activity repairs once)."""
        self._tick()
        if key in self.repairs:
            return self.repairs[key]
        self._node(node)
        old = self.machines[node]
        if rung in (Rung.RESET_GPU, Rung.MONITOR):
            done = Repair(node, rung, old.vm_id, old.vm_id, None)
        else:
            new_vm = f"vm-{uuid.uuid4().hex[:12]}" if rung == Rung.REPLACE else old.vm_id
            self.machines[node] = Machine(new_vm, uuid.uuid4().hex, None)
            self._power_off(node)
            done = Repair(node, rung, old.vm_id, new_vm, time.time())
        self.repairs[key] = done
        return done

    def take_booted(self) -> list[tuple[str, str]]:
        """(node, boot id) of each machine that came up since the last call."""
        self._tick()
        out = [(n, self.machines[n].boot_id) for n in self.booted]
        self.booted.clear()
        return out

    # --- time passing ------------------------------------------------------------------

    def _tick(self) -> None:
        """Boots finish, released jobs start on idle nodes: what happened since last asked."""
        now = time.time()
        for name, since in list(self.booting.items()):
            if since + self.boot_delay_s > now:
                continue
            del self.booting[name]
            self.machines[name].up_at = now
            n = self.nodes[name]
            n.state = "idle"
            n.state_flags = [f for f in n.state_flags if f != "NOT_RESPONDING"]
            n.slurmd_start_time = int(now)
            self.booted.append(name)
        if not any(at + 1.0 <= now for at in self.released_at.values()):
            return
        free = [
            n.name
            for n in self.nodes.values()
            if n.state == "idle" and not n.state_flags and not n.reason
        ]
        for job_id, at in list(self.released_at.items()):
            if at + 1.0 > now or len(free) < self.job_nodes:
                continue
            del self.released_at[job_id]
            self._start(self.jobs[job_id], free[: self.job_nodes])
            del free[: self.job_nodes]

    def _power_off(self, node: str) -> None:
        n = self.nodes[node]
        for j in self.jobs.values():
            if j.job_state in ACTIVE and node in hostlist.expand(j.nodes):
                others = [x for x in hostlist.expand(j.nodes) if x != node]
                j.job_state, j.state_reason = "NODE_FAIL", "NodeDown"
                self._settle(others)
        n.state = "down"
        if "NOT_RESPONDING" not in n.state_flags:
            n.state_flags.append("NOT_RESPONDING")
        self.booting[node] = time.time()

    # --- helpers -----------------------------------------------------------------------

    def _new_job(self) -> SlurmJob:
        job_id = next(self._ids)
        job = SlurmJob(job_id=job_id, name=f"train-{job_id}", job_state="PENDING", requeue=True)
        self.jobs[job_id] = job
        return job

    def _start(self, job: SlurmJob, names: list[str]) -> None:
        job.job_state, job.state_reason, job.nodes = "RUNNING", "None", ",".join(names)
        for name in names:
            self.nodes[name].state = "allocated"

    def _settle(self, names: list[str]) -> None:
        """Nodes a job left go idle unless another active job still holds them."""
        for name in names:
            n = self.nodes.get(name)
            if n is None or n.state != "allocated":
                continue
            if not any(
                j.job_state in ACTIVE and name in hostlist.expand(j.nodes)
                for j in self.jobs.values()
            ):
                n.state = "idle"

    def _node(self, name: str) -> SlurmNode:
        if name not in self.nodes:
            raise StandInError(f"scontrol update NodeName={name}: Invalid node name specified")
        return self.nodes[name]

    def _job(self, job_id: int) -> SlurmJob:
        if job_id not in self.jobs:
            raise StandInError(f"scontrol: job {job_id}: Invalid job id specified")
        return self.jobs[job_id]


def node_name(i: int) -> str:
    return f"gpu-{i:04d}"
