"""A requeue on a node that does not answer (power, a kernel panic, its link down): slurmctld
keeps the requeued job completing there until its RPC timeouts and SlurmdTimeout (300 s by
default) have passed. The incident's node is its own to repair: the requeue step marks it
DOWN, its drain and reason kept, so the job ends there and starts elsewhere at once. A node
that answers is never marked down."""

from __future__ import annotations

import asyncio

from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import RequeueInput, RequeueResult, drain_reason
from tests.fakes import FakeSlurm

REASON = drain_reason("INC-1", "NODE_NOT_READY")


def _requeue(slurm: FakeSlurm) -> RequeueResult:
    inp = RequeueInput(
        node="gpu-01", incident_id="INC-1", drain_reason=REASON, poll_s=0.01, hold_watch_s=0.05
    )
    run = ActivityEnvironment().run(SlurmActivities(slurm).requeue_jobs, inp)
    result: RequeueResult = asyncio.run(asyncio.wait_for(run, 30))
    return result


def _cluster(answering: bool, completing_reads: int) -> FakeSlurm:
    slurm = FakeSlurm()
    flags = ["DRAIN"] if answering else ["DRAIN", "NOT_RESPONDING"]
    slurm.add_node("gpu-01", state="mixed", state_flags=flags, reason=REASON)
    slurm.add_node("gpu-02")
    slurm.add_job(101, nodes="gpu-[01-02]")
    slurm.completing_reads[101] = completing_reads  # how long Slurm shows it completing
    return slurm


def test_a_lost_node_is_marked_down_so_its_requeued_job_ends_there() -> None:
    slurm = _cluster(answering=False, completing_reads=1_000_000)  # until SlurmdTimeout
    done = _requeue(slurm)
    assert done.marked_down and done.requeued == [101]
    assert "marked DOWN" in done.describe()
    node = slurm.node_now("gpu-01")
    assert (node.state, node.reason) == ("down", REASON) and node.drained  # drain kept
    assert slurm.calls["mark_down"] == 1
    assert slurm.log.index(("requeue", "101")) < slurm.log.index(("mark_down", "gpu-01"))
    assert done.holds_released == [101]


def test_a_node_that_answers_is_never_marked_down() -> None:
    slurm = _cluster(answering=True, completing_reads=3)
    done = _requeue(slurm)
    assert not done.marked_down and done.requeued == [101]
    assert slurm.calls["mark_down"] == 0
    assert slurm.node_now("gpu-01").state != "down"
