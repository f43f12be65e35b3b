"""GpuSharing on the time-skipping test server, the real workflow against the in-memory
world of tests/fakes/sharing.py (fake activities under the real names).

Aspects covered:
- lend on a sustained SLO breach: drain, checkpoint, hand-over, scale, serve, mark lent, in
  that order; the idle node first, else the most recently checkpointed, never one in an
  incident; the move carries its demand; a job is requeued once though its step is retried;
- return when demand falls: scale down (a replica per node still lent), reclaim, health
  gate with the agent's evidence, resume, regrow; a node failing the gate stays drained,
  unhealthy, a human is paged, and it is not lent again;
- hysteresis and cooldown on noisy signals over a long simulated period; a spike lends
  nothing; the minimum training and maximum inference nodes hold in a long breach;
- a fault during a move: the incident gets the node after the move's current step, the
  move ends `yielded`, and the sharing workflow settles the node's Kubernetes side; a lent node
  is yielded at once and leaves the pool; a node not held (or no sharing workflow) is not;
- approval mode, manual moves and their validation; `evaluate_now`; continue-as-new.

Evaluations are driven by `evaluate_now` (real time; the timer is an hour away) except in
the long-period tests, which skip time with `env.sleep`.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkflowRunner

from autoclusters.activities.sharing_yield import ShareYieldActivities
from autoclusters.clients.sharing import MoveRefused, clear_unhealthy, request_move
from autoclusters.core.decision_proof import LIFETIME_S, Decision, sign
from autoclusters.core.evidence import HealthSnapshot
from autoclusters.core.sharing import (
    BY_SHARING,
    LENT_REASON,
    MOVE_APPROVAL_STEP,
    ClearUnhealthy,
    Demand,
    InferenceTarget,
    MoveDecision,
    MoveRecord,
    MoveRequest,
    NodeShare,
    Pool,
    SharePolicy,
    ShareStatus,
    SharingInput,
    YieldCall,
    YieldResult,
    decide,
    move_subject,
    sharing_workflow_id,
)
from autoclusters.workflows import gpu_sharing
from autoclusters.workflows.gpu_sharing import GpuSharing
from tests.decisions import APPROVAL_KEY, FORGED_KEY, proof_checks, signed_move
from tests.fakes.sharing import LEND_STEPS, RETURN_STEPS, ShareWorld
from tests.fakes.sharing import Node as N
from tests.fakes.systems import agent_snapshot
from tests.helpers import eventually, skip_time

pytestmark = pytest.mark.workflow

SLO = 0.5
HIGH, LOW, MID = 0.9, 0.05, 0.3  # breach, calm, inside the hysteresis band


def policy(**changes: Any) -> SharePolicy:
    fields: dict[str, Any] = {
        "inference": InferenceTarget(slo=SLO),
        "min_training_nodes": 1,
        "max_inference_nodes": 2,
        "sustain": 2,
        "cooldown_s": 0,
        "evaluate_every_s": 3600,  # evaluations come from evaluate_now unless time skips
        "ready_timeout_s": 600,
    }
    return SharePolicy(**{**fields, **changes})


@dataclass
class RunningSharing:
    env: WorkflowEnvironment
    world: ShareWorld
    cluster: str
    task_queue: str
    handle: WorkflowHandle[GpuSharing, None]

    async def status(self) -> ShareStatus:
        return await self.handle.query(GpuSharing.status)

    async def evaluate(self, times: int = 1) -> ShareStatus:
        """Evaluate now, `times` over, each time until its move (if any) has ended."""
        for _ in range(times):
            before = (await self.status()).evaluations
            await self.handle.signal(GpuSharing.evaluate_now, "test")

            async def done(before: int = before) -> ShareStatus | None:
                s = await self.status()
                return s if s.evaluations > before and s.current is None else None

            await eventually(done, what="an evaluation and its move")
        return await self.status()

    def move(self, s: ShareStatus, node: str) -> MoveRecord:
        found = [m for m in s.moves if m.move.node == node]
        assert found, f"no move of {node} in {[m.move.node for m in s.moves]}"
        return found[-1]


@asynccontextmanager
async def running_sharing(
    env: WorkflowEnvironment,
    world: ShareWorld,
    pol: SharePolicy,
    *,
    workflows: Sequence[type] = (),
    activities: Sequence[Callable[..., Any]] = (),
    runner: WorkflowRunner | None = None,
) -> AsyncIterator[RunningSharing]:
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    tq = f"tq-{uuid.uuid4()}"
    extra: dict[str, Any] = {"workflow_runner": runner} if runner else {}
    async with Worker(
        env.client,
        task_queue=tq,
        workflows=[GpuSharing, *workflows],
        activities=[*world.activities(), *activities, *proof_checks()],
        **extra,
    ):
        await env.client.start_workflow(
            GpuSharing.run,
            SharingInput(cluster=cluster, policy=pol),
            id=sharing_workflow_id(cluster),
            task_queue=tq,
            execution_timeout=timedelta(days=30),
        )
        # Whichever run is the latest (it continues as new).
        handle = env.client.get_workflow_handle_for(GpuSharing.run, sharing_workflow_id(cluster))
        try:
            yield RunningSharing(env, world, cluster, tq, handle)
        finally:
            try:
                await handle.terminate(reason="test over")
            except RPCError:
                pass


def nodes(count: int, **busy: list[int]) -> list[N]:
    """gpu-01.. gpu-NN, in training; `busy` maps a node to its jobs."""
    out = []
    for i in range(1, count + 1):
        name = f"gpu-{i:02d}"
        out.append(N(name, jobs=list(busy.get(name.replace("-", "_"), []))))
    return out


# --- lend --------------------------------------------------------------------------------


async def test_lend_on_sustained_breach_runs_the_steps_in_order(env: WorkflowEnvironment) -> None:
    world = ShareWorld(nodes(3, gpu_01=[101], gpu_02=[102], gpu_03=[103]), [MID, HIGH, HIGH])
    world.nodes["gpu-01"].last_checkpoint_at = 1000.0
    world.nodes["gpu-02"].last_checkpoint_at = 3000.0  # the least work lost
    world.nodes["gpu-03"].last_checkpoint_at = 2000.0
    world.fail_checkpoint_once = True
    async with running_sharing(env, world, policy()) as r:
        s = await r.evaluate(2)
        assert world.names() == []  # one breach is not sustained
        s = await r.evaluate()

    rec = r.move(s, "gpu-02")
    assert rec.status == "done" and rec.move.to == "inference"
    assert [st.name for st in rec.steps] == [
        "drain",
        "checkpoint_and_requeue",
        "k8s_lend",
        "scale_up_inference",
        "wait_serving",
        "mark_lent",
    ]
    # The checkpoint step ran twice (it failed after acting) and the job moved once.
    assert world.names(rec.move.move_id) == [*LEND_STEPS[:2], *LEND_STEPS[1:]]
    assert [c.attempt for c in world.of("share_checkpoint_jobs")] == [1, 2]
    assert world.requeued == {102: 1} and world.pending == [102]
    assert [c.replicas for c in world.of("share_scale_inference")] == [1]
    assert world.replicas == 1
    # The demand that justified it: the second breach in a row.
    assert rec.move.demand is not None and rec.move.demand.inference_value == HIGH
    assert rec.move.requested_by == BY_SHARING
    assert s.pools["gpu-02"] == Pool.INFERENCE
    assert world.nodes["gpu-02"].pods == 1 and not world.nodes["gpu-02"].jobs
    assert world.violations == []


async def test_lend_picks_idle_first_then_latest_checkpoint_never_an_incident(
    env: WorkflowEnvironment,
) -> None:
    world = ShareWorld(nodes(4, gpu_01=[101], gpu_04=[104]), [HIGH])
    world.nodes["gpu-01"].last_checkpoint_at = 2000.0
    world.nodes["gpu-04"].last_checkpoint_at = 1000.0
    world.nodes["gpu-02"].in_incident = True  # idle, but a remediation incident owns it
    async with running_sharing(
        env, world, policy(max_inference_nodes=5, min_training_nodes=1)
    ) as r:
        s = await r.evaluate(8)

    lent = [c.node for c in world.of("share_drain_for_move")]
    # gpu-03 is idle; then gpu-01 checkpointed later than gpu-04; then min training (1):
    # gpu-02 is in an incident, so it runs no training and does not count.
    assert lent == ["gpu-03", "gpu-01"]
    assert [c.replicas for c in world.of("share_scale_inference")] == [1, 2]
    assert "gpu-02" not in {c.node for c in world.calls}
    assert s.pools == {
        "gpu-01": Pool.INFERENCE,
        "gpu-02": Pool.TRAINING,
        "gpu-03": Pool.INFERENCE,
        "gpu-04": Pool.TRAINING,
    }
    assert s.last_verdict is not None and "minimum of 1 training" in s.last_verdict.why
    assert world.requeued == {101: 1}


async def test_a_return_regrows_the_jobs_its_lend_narrowed(env: WorkflowEnvironment) -> None:
    world = ShareWorld(
        nodes(3, gpu_01=[101], gpu_02=[102], gpu_03=[103]), [HIGH, HIGH, LOW], agent=False
    )
    async with running_sharing(env, world, policy()) as r:
        s = await r.evaluate(2)
        assert r.move(s, "gpu-01").status == "done" and world.regrown == []
        s = await r.evaluate(2)

    back = r.move(s, "gpu-01")
    assert back.move.to == "training" and back.status == "done"
    # Job 101 left gpu-01 for the lend, two nodes wide before: the return regrows it, once.
    assert world.regrown == [{101: 2}]


async def test_a_return_waits_for_the_load_that_needed_the_lend_to_fall(
    env: WorkflowEnvironment,
) -> None:
    # With the lent node serving, latency is calm at once; the request rate is not.
    world = ShareWorld(nodes(3), [HIGH, HIGH, LOW, LOW, LOW, LOW], agent=False)
    world.rates = [40, 40, 40, 40, 5, 5]
    async with running_sharing(env, world, policy()) as r:
        s = await r.evaluate(2)
        assert [m.move.to for m in s.moves] == ["inference"]
        s = await r.evaluate(2)
        assert [m.move.to for m in s.moves] == ["inference"]  # the load is still there
        assert s.last_verdict is not None and "request rate 40/s" in s.last_verdict.why
        s = await r.evaluate(2)
    assert [m.move.to for m in s.moves] == ["inference", "training"]


def test_a_calm_latency_returns_at_once_without_a_rate_or_once_the_rate_fell() -> None:
    pol = policy()
    serving = NodeShare(name="gpu-01", pool=Pool.INFERENCE, pods=1)
    calm = Demand(at=0, inference_value=LOW, slo=SLO, inference_rps=30, nodes=[serving])
    args: dict[str, Any] = {"breach_streak": 0, "calm_streak": 5, "seconds_since_last_move": 60}
    assert decide(calm, pol, **args, lend_rps=40).to is None  # 30 > 0.5 x 40
    assert decide(calm, pol, **args, lend_rps=None).to == "training"  # no lend on record
    fell = calm.model_copy(update={"inference_rps": 19.0})
    assert decide(fell, pol, **args, lend_rps=40).to == "training"
    unknown = calm.model_copy(update={"inference_rps": None})
    assert decide(unknown, pol, **args, lend_rps=40).to == "training"  # latency decides


async def test_a_job_not_started_again_at_a_return_is_regrown_at_the_next(
    env: WorkflowEnvironment,
) -> None:
    # Lend, return while job 101 still waits to start (a second lend may narrow it again),
    # lend and return again: the second return still regrows it.
    world = ShareWorld(
        nodes(3, gpu_01=[101], gpu_02=[102], gpu_03=[103]),
        [HIGH, HIGH, LOW, LOW, HIGH, HIGH, LOW],
        agent=False,
    )
    world.not_started = {101}
    async with running_sharing(env, world, policy()) as r:
        await r.evaluate(2)
        await r.evaluate(2)
        assert world.regrown == [{101: 2}]
        world.not_started.clear()
        s = await r.evaluate(4)
    assert [m.move.to for m in s.moves] == [
        "inference", "training", "inference", "training"
    ]  # fmt: skip
    assert world.regrown[1].get(101) == 2, world.regrown


# --- return ------------------------------------------------------------------------------


def lent(name: str) -> N:
    return N(name, pool=Pool.INFERENCE, pods=1, drain_reason=LENT_REASON)


async def test_return_when_demand_falls_and_a_node_failing_the_gate_stays_drained(
    env: WorkflowEnvironment,
) -> None:
    world = ShareWorld(
        [N("gpu-01", jobs=[101]), lent("gpu-02"), lent("gpu-03")], [LOW], gate_fails={"gpu-03"}
    )
    world.replicas = 2
    async with running_sharing(env, world, policy()) as r:
        await r.evaluate()
        await r.handle.signal(GpuSharing.evaluate_now, "calm")  # the second calm: a return

        async def gate_waits() -> HealthSnapshot | None:
            gates = world.of("health_gate")
            if not gates:
                return None
            snap = agent_snapshot("gpu-02", observed_at=datetime.fromtimestamp(gates[-1].at, UTC))
            return snap if await r.handle.query(GpuSharing.wants_evidence, snap) else None

        snap = await eventually(gate_waits, what="the return's gate to wait for evidence")
        # Without the agent's word the node is not resumed.
        during = await r.status()
        assert during.current is not None and during.current.move.node == "gpu-02"
        assert not world.of("share_resume_training")
        ack = await r.handle.execute_update(GpuSharing.health_evidence, snap)
        assert ack.kept
        s = await r.evaluate(2)  # the next return: gpu-03, which fails its gate

    back = r.move(s, "gpu-02")
    assert back.status == "done" and back.move.to == "training"
    assert [st.name for st in back.steps] == [
        "scale_down_inference",
        "k8s_reclaim",
        "health_gate",
        "health_verdict",
        "resume_in_slurm",
        "regrow_jobs",
    ]
    assert [c.name for c in world.calls if c.node == "gpu-02"] == RETURN_STEPS
    # Each scale-down keeps a replica per node still lent.
    assert [(c.node, c.replicas) for c in world.of("share_k8s_release")] == [
        ("gpu-02", 1),
        ("gpu-03", 0),
    ]
    assert back.move.demand is not None and back.move.demand.inference_value == LOW
    failed = r.move(s, "gpu-03")
    assert failed.status == "failed"
    assert [c.name for c in world.calls if c.node == "gpu-03"] == [
        "share_k8s_release",
        "share_k8s_reclaim",
        "health_gate",
        "notify",
    ]
    assert s.unhealthy == ["gpu-03"]
    assert world.nodes["gpu-03"].drain_reason  # left drained
    assert [(n.node, n.event, n.severity) for n in world.notes] == [
        ("gpu-03", "health_gate_failed", "critical")
    ]
    assert s.pools["gpu-02"] == Pool.TRAINING and "gpu-03" not in s.pools
    assert world.violations == []


# --- flapping, bounds --------------------------------------------------------------------

EVERY_S = 15
COOLDOWN_S = 120


async def run_for(
    world: ShareWorld, env: WorkflowEnvironment, pol: SharePolicy, s: float
) -> ShareStatus:
    """Let the sharing workflow evaluate on its own timer for `s` simulated seconds."""
    async with running_sharing(env, world, pol) as r:
        await skip_time(env, timedelta(seconds=s))
        return await r.status()


def moves_of(world: ShareWorld) -> list[tuple[float, float]]:
    """(start, end) of every completed move, from the calls: a lend starts at its drain and
    ends at mark_lent, a return starts at its scale-down and ends at its regrow."""
    starts = {
        c.move_id: c.at
        for c in world.calls
        if c.name in ("share_drain_for_move", "share_k8s_release")
    }
    ends = {
        c.move_id: c.at for c in world.calls if c.name in ("share_mark_lent", "share_regrow_jobs")
    }
    return sorted((starts[m], ends[m]) for m in starts if m in ends)


@pytest.mark.parametrize(
    ("name", "script"),
    [
        ("noise-around-the-slo", lambda n: SLO + (0.1 if n % 2 else -0.1)),
        ("alternating-breach-calm", lambda n: HIGH if n % 2 else LOW),
        ("one-spike", lambda n: HIGH if n == 5 else MID),
    ],
)
async def test_a_noisy_signal_moves_nothing(
    env: WorkflowEnvironment, name: str, script: Callable[[int], float]
) -> None:
    world = ShareWorld(nodes(4), script)
    pol = policy(evaluate_every_s=EVERY_S, cooldown_s=COOLDOWN_S, max_inference_nodes=3)
    s = await run_for(world, env, pol, 200 * EVERY_S)
    assert s.evaluations >= 150, s.evaluations
    assert world.names() == [], name
    assert s.moves == []


async def test_cooldown_spaces_moves_on_a_slow_oscillation(env: WorkflowEnvironment) -> None:
    # Four breaches, four calms, over and over: without the cooldown a lend every two
    # breaches and a return every two calms.
    world = ShareWorld(nodes(4), lambda n: HIGH if (n // 4) % 2 == 0 else LOW, agent=False)
    pol = policy(evaluate_every_s=EVERY_S, cooldown_s=COOLDOWN_S, max_inference_nodes=3)
    period_s = 300 * EVERY_S
    s = await run_for(world, env, pol, period_s)

    moves = moves_of(world)
    assert len(moves) >= 4, moves  # it does move
    assert len(moves) <= period_s / COOLDOWN_S + 1
    gaps = [b[0] - a[1] for a, b in zip(moves, moves[1:], strict=False)]
    assert min(gaps) >= COOLDOWN_S, gaps
    assert all(m.status == "done" for m in s.moves)
    assert world.violations == []


@pytest.mark.parametrize(
    ("count", "min_training", "max_inference", "lends"), [(5, 2, 4, 3), (5, 0, 2, 2)]
)
async def test_a_long_breach_keeps_min_training_and_max_inference(
    env: WorkflowEnvironment, count: int, min_training: int, max_inference: int, lends: int
) -> None:
    world = ShareWorld(nodes(count), [HIGH], agent=False)
    pol = policy(
        evaluate_every_s=EVERY_S,
        cooldown_s=0,
        sustain=1,
        min_training_nodes=min_training,
        max_inference_nodes=max_inference,
    )
    s = await run_for(world, env, pol, 100 * EVERY_S)

    assert s.evaluations >= 80
    assert len(world.of("share_mark_lent")) == lends
    assert min(t for t, _ in world.pool_counts) == count - lends >= min_training
    assert max(i for _, i in world.pool_counts) == lends <= max_inference
    assert sum(p == Pool.INFERENCE for p in s.pools.values()) == lends


async def test_random_demand_never_crosses_the_bounds(env: WorkflowEnvironment) -> None:
    rng = random.Random(14)
    script = [rng.choice([HIGH, HIGH, LOW, MID, None]) for _ in range(400)]
    world = ShareWorld(nodes(4), script, agent=False)
    pol = policy(
        evaluate_every_s=EVERY_S,
        cooldown_s=0,
        sustain=1,
        min_training_nodes=2,
        max_inference_nodes=2,
    )
    s = await run_for(world, env, pol, 300 * EVERY_S)

    assert s.evaluations >= 200
    assert len(moves_of(world)) >= 10  # the bounds were tested, not avoided
    assert min(t for t, _ in world.pool_counts) >= 2
    assert max(i for _, i in world.pool_counts) <= 2
    # Each scale sets one replica per lent node.
    for c in world.of("share_scale_inference") + world.of("share_k8s_release"):
        assert c.replicas is not None and 0 <= c.replicas <= 2
    assert world.violations == []


# --- a fault during a move -----------------------------------------------------------------


# Unsandboxed: this module imports the sandbox's helpers, which read the home directory.
@workflow.defn(name="IncidentStandIn", sandboxed=False)
class IncidentStandIn:
    """An incident's one step that matters here: take the node from the sharing workflow (the
    real `share_yield_node` activity, as the runbook calls it)."""

    @workflow.run
    async def run(self, call: YieldCall) -> YieldResult:
        return await workflow.execute_activity(
            "share_yield_node",
            call,
            result_type=YieldResult,
            start_to_close_timeout=timedelta(minutes=15),
        )


async def updates_accepted(r: RunningSharing) -> int:
    history = await r.handle.fetch_history()
    return sum(
        1
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    )


async def test_a_fault_during_a_lend_takes_the_node_after_the_current_step(
    env: WorkflowEnvironment,
) -> None:
    world = ShareWorld(nodes(3, gpu_01=[101], gpu_02=[102], gpu_03=[103]), [HIGH])
    world.nodes["gpu-02"].last_checkpoint_at = 9000.0
    world.hold_checkpoint = asyncio.Event()
    yields = ShareYieldActivities(env.client)
    async with running_sharing(
        env, world, policy(), workflows=[IncidentStandIn], activities=[yields.yield_node]
    ) as r:
        await r.evaluate()
        await r.handle.signal(GpuSharing.evaluate_now, "breach")
        await asyncio.wait_for(world.checkpoint_started.wait(), timeout=30)
        # An incident opens on gpu-02 while its jobs checkpoint.
        call = YieldCall(cluster=r.cluster, node="gpu-02", incident_id="INC-7")
        world.nodes["gpu-02"].in_incident = True
        incident = await env.client.start_workflow(
            IncidentStandIn.run, call, id=f"inc-{uuid.uuid4()}", task_queue=r.task_queue
        )

        async def accepted() -> bool:
            return await updates_accepted(r) == 1

        await eventually(accepted, what="the sharing workflow to accept yield_node")
        # The step still runs: the incident waits.
        during = await r.status()
        assert (
            during.current is not None and during.current.steps[-1].name == "checkpoint_and_requeue"
        )
        assert (await incident.describe()).status == WorkflowExecutionStatus.RUNNING
        world.hold_checkpoint.set()

        async def incident_done() -> bool:
            return (await incident.describe()).status == WorkflowExecutionStatus.COMPLETED

        await eventually(incident_done, what="the incident's yield to return")
        # Awaiting a result unlocks time skipping: the sharing workflow's hour-long timer would
        # fire and a second breach would lend another node.
        with env.auto_time_skipping_disabled():
            got = await incident.result()

        async def settled() -> ShareStatus | None:
            s = await r.status()
            return s if world.of("share_k8s_reclaim") and s.current is None else None

        s = await eventually(settled, what="the sharing workflow to settle gpu-02")

    assert got == YieldResult(
        held=True, pool_before=Pool.MOVING, waited_for_step="checkpoint_and_requeue"
    )
    rec = r.move(s, "gpu-02")
    assert rec.status == "yielded" and "INC-7" in rec.error
    assert [st.name for st in rec.steps] == ["drain", "checkpoint_and_requeue"]
    # Nothing was handed to Kubernetes; the checkpoint it waited for did finish.
    assert world.names(rec.move.move_id) == LEND_STEPS[:2]
    assert world.requeued == {102: 1}
    # Then the sharing workflow let the node's Kubernetes side go: no replica counts it.
    settle = [(c.name, c.node, c.replicas) for c in world.calls if c.move_id == "yield-INC-7"]
    assert settle == [("share_scale_inference", "gpu-02", 0), ("share_k8s_reclaim", "gpu-02", 0)]
    # Not lent: the next evaluation reads it as Slurm and Kubernetes have it (the incident's).
    assert s.pools.get("gpu-02") in (None, Pool.TRAINING)
    assert world.nodes["gpu-02"].k8s_pool == "training"


async def test_a_lent_node_is_yielded_at_once_and_a_node_not_held_is_not(
    env: WorkflowEnvironment,
) -> None:
    world = ShareWorld([N("gpu-01"), lent("gpu-02"), lent("gpu-03")], [MID])
    world.replicas = 2
    async with running_sharing(env, world, policy()) as r:
        await r.evaluate()
        free = await r.handle.execute_update(
            GpuSharing.yield_node,
            YieldCall(cluster=r.cluster, node="gpu-01", incident_id="INC-1"),
        )
        world.nodes["gpu-03"].in_incident = True
        held = await r.handle.execute_update(
            GpuSharing.yield_node,
            YieldCall(cluster=r.cluster, node="gpu-03", incident_id="INC-3"),
        )

        async def settled() -> ShareStatus | None:
            s = await r.status()
            return s if world.of("share_k8s_reclaim") else None

        s = await eventually(settled, what="the sharing workflow to settle gpu-03")
    # No sharing workflow for the cluster: nobody holds the node (the real activity).
    nobody = await ActivityEnvironment().run(
        ShareYieldActivities(env.client).yield_node,
        YieldCall(cluster="no-such-cluster", node="gpu-01", incident_id="INC-9"),
    )

    assert nobody == YieldResult(held=False)
    assert free == YieldResult(held=False, pool_before=Pool.TRAINING)
    assert held == YieldResult(held=True, pool_before=Pool.INFERENCE)
    # gpu-02 still serves: one replica; gpu-03 is the incident's, out of the pool.
    settle = [(c.name, c.node, c.replicas) for c in world.calls if c.move_id == "yield-INC-3"]
    assert settle == [("share_scale_inference", "gpu-03", 1), ("share_k8s_reclaim", "gpu-03", 1)]
    assert s.pools["gpu-02"] == Pool.INFERENCE and s.pools.get("gpu-03") != Pool.INFERENCE
    assert world.names() == ["share_scale_inference", "share_k8s_reclaim"]


# --- approvals, manual moves -------------------------------------------------------------


class Dial:
    """A demand the test turns by hand."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, _: int) -> float:
        return self.value


async def waiting_approval(r: RunningSharing) -> MoveRecord:
    async def check() -> MoveRecord | None:
        s = await r.status()
        return s.current if s.current and s.current.status == "waiting_approval" else None

    return await eventually(check, what="a move waiting for approval")


async def test_approval_mode_waits_for_a_human(env: WorkflowEnvironment) -> None:
    demand = Dial(HIGH)
    world = ShareWorld(nodes(4), demand)
    async with running_sharing(env, world, policy(needs_approval=True, max_inference_nodes=3)) as r:
        await r.evaluate()
        await r.handle.signal(GpuSharing.evaluate_now, "breach")
        first = await waiting_approval(r)
        assert world.names() == ["notify"]  # asked; nothing drained
        assert world.notes[0].event == "approval_needed"
        assert first.move.move_id in world.notes[0].text
        await r.handle.execute_update(
            GpuSharing.decide_waiting_move, signed_move(r.cluster, first.move.move_id, "alice")
        )

        async def lent() -> bool:
            return bool(world.of("share_mark_lent")) and (await r.status()).current is None

        await eventually(lent, what="the approved lend")

        await r.evaluate()
        await r.handle.signal(GpuSharing.evaluate_now, "breach")
        second = await waiting_approval(r)
        await r.handle.execute_update(
            GpuSharing.decide_waiting_move,
            signed_move(r.cluster, second.move.move_id, "bob", approve=False),
        )

        async def rejected() -> ShareStatus | None:
            s = await r.status()
            return s if s.current is None and len(s.moves) == 2 else None

        s = await eventually(rejected, what="the rejection")

    one, two = s.moves
    # Each asked-about move said how it ended.
    assert [n.event for n in world.notes] == [
        "approval_needed", "move_done", "approval_needed", "move_stopped"
    ]  # fmt: skip
    assert "approved by alice" in world.notes[1].text and "bob" in world.notes[3].text
    assert (one.status, one.approved_by) == ("done", "alice")
    assert world.names(one.move.move_id) == LEND_STEPS
    assert two.status == "rejected" and "bob" in two.error and two.steps == []
    assert world.names(two.move.move_id) == []
    assert s.pools[two.move.node] == Pool.TRAINING
    assert [c.node for c in world.of("share_drain_for_move")] == [one.move.node]


async def test_a_decision_without_a_valid_proof_is_refused_by_the_sharing_workflow(
    env: WorkflowEnvironment,
) -> None:
    """What `share approve --by alice` against Temporal did before: a name, nothing else.
    Neither the update without a proof, nor one with a proof that does not hold, nor the
    old signal decides; a valid proof does, as the person it names."""
    world = ShareWorld(nodes(4), Dial(HIGH))
    async with running_sharing(env, world, policy(needs_approval=True, max_inference_nodes=3)) as r:
        await r.evaluate()
        await r.handle.signal(GpuSharing.evaluate_now, "breach")
        rec = await waiting_approval(r)
        move_id, c = rec.move.move_id, r.cluster

        async def refused(d: MoveDecision) -> str:
            with pytest.raises(WorkflowUpdateFailedError) as caught:
                await r.handle.execute_update(GpuSharing.decide_waiting_move, d)
            return str(caught.value.cause)

        assert "no proof of who decides" in await refused(
            MoveDecision(move_id=move_id, approve=True, by="alice")
        )
        expired = sign(
            Decision(move_subject(c, move_id), MOVE_APPROVAL_STEP, "alice", True, "token:x"),
            APPROVAL_KEY,
            now=time.time() - LIFETIME_S - 120,
        )
        cases = [
            (signed_move(c, move_id, "alice", key=FORGED_KEY), "not signed by our key"),
            (MoveDecision(move_id=move_id, approve=True, by="alice", proof=expired), "expired"),
            (signed_move(c, move_id, "bob").model_copy(update={"by": "alice"}),
             "bob's, not alice's"),
            (signed_move(c, move_id, "alice", approve=False).model_copy(update={"approve": True}),
             "to reject"),
            (signed_move(c, "another-move", "alice").model_copy(update={"move_id": move_id}),
             "another-move"),
            (signed_move("elsewhere", move_id, "alice"), "elsewhere"),
        ]  # fmt: skip
        for bad, said in cases:
            assert said in await refused(bad)
        # The signal carries no answer: on a run with proofs it decides nothing.
        await r.handle.signal(
            GpuSharing.decide_move, MoveDecision(move_id=move_id, approve=True, by="alice")
        )
        await r.env.sleep(1)
        st = await r.status()
        assert st.current is not None and st.current.status == "waiting_approval"
        assert world.names() == ["notify"]  # nothing drained

        ok = signed_move(c, move_id, "carol", via="token:carol")
        assert await r.handle.execute_update(GpuSharing.decide_waiting_move, ok) == "approved"

        async def done() -> MoveRecord | None:
            s = await r.status()
            return s.moves[-1] if s.current is None and s.moves else None

        rec = await eventually(done, what="the approved move")
    assert (rec.status, rec.approved_by) == ("done", "carol")


async def test_a_manual_move_is_validated_and_runs_without_approval(
    env: WorkflowEnvironment,
) -> None:
    world = ShareWorld([N("gpu-01"), N("gpu-02"), lent("gpu-03")], [MID])
    async with running_sharing(env, world, policy(needs_approval=True)) as r:
        await r.evaluate()
        refused = [
            MoveRequest(node="gpu-99", to="inference", requested_by="carol"),
            MoveRequest(node="gpu-01", to="training", requested_by="carol"),
            MoveRequest(node="gpu-03", to="inference", requested_by="carol"),
        ]
        for req in refused:
            with pytest.raises(WorkflowUpdateFailedError):
                await r.handle.execute_update(GpuSharing.request_move, req)
        # The CLI's path: the validator's words, nothing else.
        with pytest.raises(MoveRefused, match="^gpu-99 is not a GPU node this sharing workflow"):
            await request_move(env.client, r.cluster, refused[0])
        assert (await r.status()).queued == []
        move_id = await r.handle.execute_update(
            GpuSharing.request_move,
            MoveRequest(node="gpu-01", to="inference", requested_by="carol"),
        )

        async def done() -> ShareStatus | None:
            s = await r.status()
            return s if s.moves and s.current is None and not s.queued else None

        s = await eventually(done, what="the manual move")

    (rec,) = s.moves
    assert rec.move.move_id == move_id and rec.move.requested_by == "carol"
    assert rec.status == "done" and rec.approved_by is None
    assert world.names() == LEND_STEPS  # no approval asked of a person's own move
    assert [c.replicas for c in world.of("share_scale_inference")] == [2]
    assert s.pools["gpu-01"] == Pool.INFERENCE


# --- evaluate_now, continue-as-new -------------------------------------------------------


async def test_evaluate_now_does_not_wait_for_the_timer(env: WorkflowEnvironment) -> None:
    world = ShareWorld(nodes(2), [MID])
    async with running_sharing(env, world, policy()) as r:
        assert (await r.status()).evaluations == 0
        s = await r.evaluate()
        started = (await r.handle.describe()).start_time

    assert s.evaluations == 1 and s.last_demand is not None
    (read,) = world.of("share_read_demand")
    assert read.at - started.timestamp() < policy().evaluate_every_s
    assert s.last_verdict is not None and "within the band" in s.last_verdict.why


async def test_continue_as_new_carries_pools_and_moves(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker runs the workflow in this process, unsandboxed, so it sees the patch.
    monkeypatch.setattr(gpu_sharing, "EVALUATIONS_PER_RUN", 3)
    world = ShareWorld(nodes(3), [HIGH])
    async with running_sharing(env, world, policy(), runner=UnsandboxedWorkflowRunner()) as r:
        first_run = (await r.handle.describe()).run_id
        await r.evaluate(3)  # a lend at the second; the third continues as new

        async def new_run() -> str | None:
            run = (await r.handle.describe()).run_id
            return run if run != first_run else None

        await eventually(new_run, what="continue-as-new")
        carried = await r.status()
        s = await r.evaluate(2)  # and the next lend, in the new run
        runs = (await r.handle.describe()).run_id

    assert runs != first_run
    assert carried.evaluations == 3 and [m.status for m in carried.moves] == ["done"]
    assert sum(p == Pool.INFERENCE for p in carried.pools.values()) == 1
    assert s.evaluations == 5
    assert [m.move.move_id for m in s.moves] == [f"{r.cluster}-move-1", f"{r.cluster}-move-2"]
    assert sum(p == Pool.INFERENCE for p in s.pools.values()) == 2
    # The second lend knew of the first: two replicas.
    assert [c.replicas for c in world.of("share_scale_inference")] == [1, 2]


async def test_a_node_that_failed_its_gate_is_not_lent_again(env: WorkflowEnvironment) -> None:
    demand = Dial(LOW)
    world = ShareWorld([N("gpu-01", jobs=[101]), N("gpu-02", jobs=[102]), lent("gpu-03")], demand)
    world.gate_fails = {"gpu-03"}
    async with running_sharing(env, world, policy()) as r:
        s = await r.evaluate(2)
        assert r.move(s, "gpu-03").status == "failed"
        demand.value = HIGH
        s = await r.evaluate(2)

    # gpu-03 is drained and idle, the cheapest node to lend, but it failed its gate.
    assert [c.node for c in world.of("share_drain_for_move")] == ["gpu-01"]
    assert s.unhealthy == ["gpu-03"]


async def test_a_human_clears_a_node_that_failed_its_gate(env: WorkflowEnvironment) -> None:
    world = ShareWorld(
        [N("gpu-01", jobs=[101]), N("gpu-02", jobs=[102]), lent("gpu-03")], Dial(LOW)
    )
    world.gate_fails = {"gpu-03"}
    async with running_sharing(env, world, policy()) as r:
        s = await r.evaluate(2)
        assert s.unhealthy == ["gpu-03"]
        with pytest.raises(MoveRefused, match="gpu-01 is not listed"):
            await clear_unhealthy(env.client, r.cluster, ClearUnhealthy(node="gpu-01", by="ann"))
        with pytest.raises(MoveRefused, match="who cleared"):
            await clear_unhealthy(env.client, r.cluster, ClearUnhealthy(node="gpu-03", by=" "))
        done = await clear_unhealthy(env.client, r.cluster, ClearUnhealthy(node="gpu-03", by="ann"))
        assert done == "gpu-03 cleared by ann"
        s = await r.handle.query(GpuSharing.status)
        assert s.unhealthy == []
        # Twice is refused: it is no longer listed.
        with pytest.raises(MoveRefused, match="not listed"):
            await clear_unhealthy(env.client, r.cluster, ClearUnhealthy(node="gpu-03", by="ann"))
    with pytest.raises(MoveRefused, match="GPU sharing is not running"):
        await clear_unhealthy(env.client, "nowhere", ClearUnhealthy(node="gpu-03", by="ann"))


async def test_an_incident_on_a_node_waiting_for_approval_takes_it_at_once(
    env: WorkflowEnvironment,
) -> None:
    world = ShareWorld(nodes(3), [HIGH])
    async with running_sharing(env, world, policy(needs_approval=True)) as r:
        await r.evaluate()
        await r.handle.signal(GpuSharing.evaluate_now, "breach")
        waiting = await waiting_approval(r)
        got = await r.handle.execute_update(
            GpuSharing.yield_node,
            YieldCall(cluster=r.cluster, node=waiting.move.node, incident_id="INC-5"),
        )

        async def settled() -> ShareStatus | None:
            s = await r.status()
            return s if world.of("share_k8s_reclaim") and s.current is None else None

        s = await eventually(settled, what="the sharing workflow to settle the node")

    assert got == YieldResult(held=True, pool_before=Pool.MOVING, waited_for_step=None)
    rec = r.move(s, waiting.move.node)
    assert rec.status == "yielded" and rec.steps == [] and "INC-5" in rec.error
    # Asked, told it stopped (an incident took the node), then the node's Kubernetes side
    # was put back.
    assert world.names() == ["notify", "notify", "share_scale_inference", "share_k8s_reclaim"]
    assert [n.event for n in world.notes] == ["approval_needed", "move_stopped"]
    assert "INC-5" in world.notes[1].text
