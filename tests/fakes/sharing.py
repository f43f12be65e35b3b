"""One small in-memory world for GpuSharing's tests: GPU nodes with their pool, jobs and
pods, a scripted inference demand, and fake activities under the real activity names
(`share_*`, `health_gate`, `notify`) that act on it and log every call with the workflow's
(the test server's) time.

The fakes keep the world honest the way the real activities do: a checkpoint requeues a
job once even when retried, and every call checks that no node runs a Slurm job and an
inference pod at the same time.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.core.models import HealthCheck, HealthGateInput, HealthReport, Notification
from autoclusters.core.sharing import (
    LENT_REASON,
    CheckpointResult,
    Demand,
    DemandCall,
    MoveCall,
    NodeShare,
    Pool,
    RegrowResult,
    StepOutcome,
    move_reason,
)

GPUS = 8
# The steps of one move, in the order the runbook runs them (activity names).
LEND_STEPS = [
    "share_drain_for_move",
    "share_checkpoint_jobs",
    "share_k8s_lend",
    "share_scale_inference",
    "share_wait_serving",
    "share_mark_lent",
]
RETURN_STEPS = [
    "share_k8s_release",
    "share_k8s_reclaim",
    "health_gate",
    "share_resume_training",
    "share_regrow_jobs",
]


@dataclass
class Node:
    name: str
    pool: Pool = Pool.TRAINING
    jobs: list[int] = field(default_factory=list)
    last_checkpoint_at: float | None = None
    pods: int = 0
    in_incident: bool = False
    drain_reason: str = ""  # Slurm's drain reason ("": not drained)
    k8s_pool: str = ""  # the Kubernetes pool label ("": that of `pool`)

    def __post_init__(self) -> None:
        self.k8s_pool = self.k8s_pool or (
            "inference" if self.pool == Pool.INFERENCE else "training"
        )


@dataclass(frozen=True)
class Call:
    at: float  # when the server scheduled this attempt (workflow time, epoch s)
    name: str  # the activity's name
    node: str  # "" for share_read_demand
    move_id: str = ""
    replicas: int | None = None
    attempt: int = 1


Script = Sequence[float | None] | Callable[[int], float | None]


class ShareWorld:
    """demand: the value the n-th `share_read_demand` sees (a sequence repeats its last
    value; a function gets n). gate_fails: nodes whose health gate fails. agent: False, the
    gate reports no GPUs, so the workflow waits for no agent evidence (for tests that skip
    time, where its wait would time out)."""

    def __init__(
        self,
        nodes: list[Node],
        demand: Script,
        *,
        gate_fails: set[str] | None = None,
        fail_checkpoint_once: bool = False,
        agent: bool = True,
    ) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.demand = demand
        self.gate_fails = gate_fails or set()
        self.fail_checkpoint_once = fail_checkpoint_once
        self.agent = agent
        self.calls: list[Call] = []
        self.reads = 0
        self.replicas = 0
        self.requeued: Counter[int] = Counter()
        self.regrown: list[dict[int, int]] = []  # what each regrow step was asked to regrow
        self.pending: list[int] = []
        self.not_started: set[int] = set()  # requeued jobs a regrow finds still pending
        self.rates: list[float] = []  # requests/s, read by read, as demand (none: no figure)
        self.notes: list[Notification] = []
        self.violations: list[str] = []  # a node with a job and a pod at once
        # (training nodes, non-training nodes) after every call.
        self.pool_counts: list[tuple[int, int]] = []
        # Set: the checkpoint step signals `checkpoint_started` and waits for this.
        self.hold_checkpoint: asyncio.Event | None = None
        self.checkpoint_started = asyncio.Event()

    # --- what tests read back ------------------------------------------------------------

    def names(self, move_id: str | None = None) -> list[str]:
        """Activity names called (for one move), in order, each attempt once."""
        return [
            c.name
            for c in self.calls
            if c.name != "share_read_demand" and (move_id is None or c.move_id == move_id)
        ]

    def of(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def value(self, n: int) -> float | None:
        if callable(self.demand):
            return self.demand(n)
        return self.demand[min(n, len(self.demand) - 1)]

    # --- the fake activities ---------------------------------------------------------------

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.read_demand,
            self.drain_for_move,
            self.checkpoint_jobs,
            self.k8s_lend,
            self.scale_inference,
            self.wait_serving,
            self.mark_lent,
            self.k8s_release,
            self.k8s_reclaim,
            self.health_gate,
            self.resume_training,
            self.regrow_jobs,
            self.notify,
        ]

    def _log(self, name: str, node: str, call: MoveCall | None = None) -> Call:
        info = activity.info()
        c = Call(
            at=info.current_attempt_scheduled_time.timestamp(),
            name=name,
            node=node,
            move_id=call.move_id if call else "",
            replicas=call.replicas if call else None,
            attempt=info.attempt,
        )
        self.calls.append(c)
        return c

    def _after(self) -> None:
        for n in self.nodes.values():
            if n.jobs and n.pods:
                self.violations.append(f"{n.name} runs jobs {n.jobs} and {n.pods} pod(s)")
        training = sum(1 for n in self.nodes.values() if n.pool == Pool.TRAINING)
        self.pool_counts.append((training, len(self.nodes) - training))

    @activity.defn(name="share_read_demand")
    async def read_demand(self, call: DemandCall) -> Demand:
        c = self._log("share_read_demand", "")
        value = self.value(self.reads)
        rps = self.rates[min(self.reads, len(self.rates) - 1)] if self.rates else None
        self.reads += 1
        return Demand(
            at=c.at,
            inference_value=value,
            inference_rps=rps,
            slo=call.policy.inference.slo,
            ready_replicas=self.replicas,
            nodes=[
                NodeShare(
                    name=n.name,
                    # As the real activity: the sharing workflow's own word, else the label.
                    pool=call.pools.get(n.name, Pool(n.k8s_pool)),
                    gpus=GPUS,
                    jobs=list(n.jobs),
                    last_checkpoint_at=n.last_checkpoint_at,
                    pods=n.pods,
                    in_incident=n.in_incident,
                )
                for n in self.nodes.values()
            ],
        )

    @activity.defn(name="share_drain_for_move")
    async def drain_for_move(self, call: MoveCall) -> StepOutcome:
        self._log("share_drain_for_move", call.node, call)
        n = self.nodes[call.node]
        n.drain_reason, n.pool = move_reason(call.move_id), Pool.MOVING
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_checkpoint_jobs")
    async def checkpoint_jobs(self, call: MoveCall) -> CheckpointResult:
        self._log("share_checkpoint_jobs", call.node, call)
        if self.hold_checkpoint is not None:
            self.checkpoint_started.set()
            while not self.hold_checkpoint.is_set():
                activity.heartbeat()
                try:
                    await asyncio.wait_for(self.hold_checkpoint.wait(), timeout=1)
                except TimeoutError:
                    pass
        n = self.nodes[call.node]
        # The job is asked to checkpoint and requeued: it leaves the node (idempotent: a
        # retry finds the node already empty).
        done = list(n.jobs)
        for job in done:
            self.requeued[job] += 1
            self.pending.append(job)
        n.jobs = []
        self._after()
        if self.fail_checkpoint_once:
            self.fail_checkpoint_once = False
            raise ApplicationError("lost the connection after requeueing")
        # Every job here ran two nodes wide before the lend (what a return regrows to).
        return CheckpointResult(signalled=done, widths={job: 2 for job in done})

    @activity.defn(name="share_k8s_lend")
    async def k8s_lend(self, call: MoveCall) -> StepOutcome:
        self._log("share_k8s_lend", call.node, call)
        self.nodes[call.node].k8s_pool = "inference"
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_scale_inference")
    async def scale_inference(self, call: MoveCall) -> StepOutcome:
        self._log("share_scale_inference", call.node, call)
        self.replicas = call.replicas
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_wait_serving")
    async def wait_serving(self, call: MoveCall) -> StepOutcome:
        self._log("share_wait_serving", call.node, call)
        self.nodes[call.node].pods = 1
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_mark_lent")
    async def mark_lent(self, call: MoveCall) -> StepOutcome:
        self._log("share_mark_lent", call.node, call)
        n = self.nodes[call.node]
        n.drain_reason, n.pool = LENT_REASON, Pool.INFERENCE
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_k8s_release")
    async def k8s_release(self, call: MoveCall) -> StepOutcome:
        self._log("share_k8s_release", call.node, call)
        self.replicas = call.replicas
        n = self.nodes[call.node]
        n.pods, n.pool = 0, Pool.MOVING
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_k8s_reclaim")
    async def k8s_reclaim(self, call: MoveCall) -> StepOutcome:
        self._log("share_k8s_reclaim", call.node, call)
        self.nodes[call.node].k8s_pool = "training"
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="health_gate")
    async def health_gate(self, inp: HealthGateInput) -> HealthReport:
        c = self._log("health_gate", inp.node)
        ok = inp.node not in self.gate_fails
        return HealthReport(
            node=inp.node,
            passed=ok,
            checks=[HealthCheck(name="slurm", passed=ok, detail="" if ok else "2 of 8 GPUs")],
            checked_at=c.at,
            expected_gpus=GPUS if self.agent else 0,
        )

    @activity.defn(name="share_resume_training")
    async def resume_training(self, call: MoveCall) -> StepOutcome:
        self._log("share_resume_training", call.node, call)
        n = self.nodes[call.node]
        n.drain_reason, n.pool = "", Pool.TRAINING
        self._after()
        return StepOutcome(changed=True)

    @activity.defn(name="share_regrow_jobs")
    async def regrow_jobs(self, call: MoveCall) -> RegrowResult:
        self._log("share_regrow_jobs", call.node, call)
        self.regrown.append(dict(call.regrow))
        waiting = sorted(j for j in call.regrow if j in self.not_started)
        return RegrowResult(
            settled=sorted(j for j in call.regrow if j not in self.not_started), pending=waiting
        )

    @activity.defn(name="notify")
    async def notify(self, note: Notification) -> None:
        self._log("notify", note.node)
        self.notes.append(note)
