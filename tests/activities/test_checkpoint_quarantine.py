"""Checkpoint-aware quarantine's Slurm step (activities/checkpoint.py) against the in-memory
Slurm of tests/fakes/systems.py, followed by the runbook's own requeue step:

- a job that checkpoints when asked is signalled once (a retried step does not signal it
  again), leaves the node, is reported checkpointed; the requeue step then requeues nothing
  (its own requeue was the fault's one) and releases its hold;
- a job that ignores the signal stays after the budget, and the requeue step requeues it
  exactly once;
- a job that cannot be requeued is not signalled (its checkpoint would end it for good);
- a controller that cannot be reached is an outage, not "no jobs".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.checkpoint import CheckpointActivities
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import CheckpointInput, RequeueInput
from autoclusters.integrations.slurm import SlurmUnavailable
from tests.fakes.systems import FakeSlurm

INCIDENT = "inc-20261202-060000-gpu-1"


def run(fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Any:
    """Run the activity `fn(arg)` inside an activity context (its heartbeats need one)."""
    return asyncio.run(ActivityEnvironment().run(fn, arg))


def ask(budget_s: float = 0.3) -> CheckpointInput:
    return CheckpointInput(node="gpu-1", incident_id=INCIDENT, budget_s=budget_s, poll_s=0.01)


def requeue() -> RequeueInput:
    return RequeueInput(node="gpu-1", incident_id=INCIDENT, poll_s=0.01, hold_watch_s=0.05)


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    for n in ("gpu-1", "gpu-2"):
        s.add_node(n)
    return s


def test_a_checkpointing_job_is_asked_once_and_requeues_itself(slurm: FakeSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-2]")
    slurm.checkpointing.add(7)
    out = run(CheckpointActivities(slurm).checkpoint_jobs, ask())
    assert (out.signalled, out.checkpointed, out.left, out.stayed) == ([7], [7], [7], [])
    # A retry after the side effect (the worker died before reporting): no second signal.
    again = run(CheckpointActivities(slurm).checkpoint_jobs, ask())
    assert slurm.signals[7] == 1 and again.signalled == [7] and again.left == [7]
    # The requeue step that follows: the job left by its own requeue, which was this
    # incident's; it is not requeued again, only released from its hold.
    after = run(SlurmActivities(slurm).requeue_jobs, requeue())
    assert after.requeued_now == [] and after.requeued == [7]
    assert slurm.requeue_count[7] == 0 and slurm.release_count[7] == 1
    job = slurm.job_now(7)
    assert (job.job_state, job.state_reason, job.restart_cnt) == ("PENDING", "None", 1)


def test_a_job_that_ignores_the_signal_is_requeued_once_after_the_budget(
    slurm: FakeSlurm,
) -> None:
    slurm.add_job(8, nodes="gpu-1")
    out = run(CheckpointActivities(slurm).checkpoint_jobs, ask(budget_s=0.05))
    assert (out.signalled, out.checkpointed, out.left, out.stayed) == ([8], [], [], [8])
    assert out.waited_s >= 0.05
    assert "still running after the budget [8]" in out.describe()
    after = run(SlurmActivities(slurm).requeue_jobs, requeue())
    assert after.requeued_now == [8]
    assert slurm.requeue_count[8] == 1 and slurm.signals[8] == 1
    # A retried requeue step does not requeue it a second time.
    run(SlurmActivities(slurm).requeue_jobs, requeue())
    assert slurm.requeue_count[8] == 1


def test_a_job_that_cannot_be_requeued_is_not_asked(slurm: FakeSlurm) -> None:
    slurm.add_job(9, nodes="gpu-1", requeue=False)
    slurm.checkpointing.add(9)
    out = run(CheckpointActivities(slurm).checkpoint_jobs, ask())
    assert (out.signalled, out.not_asked) == ([], [9])
    assert slurm.signals[9] == 0 and slurm.job_now(9).job_state == "RUNNING"
    assert out.describe() == "no job to ask; cannot requeue [9], left running"


def test_an_unreachable_controller_is_an_outage_not_no_jobs(slurm: FakeSlurm) -> None:
    slurm.add_job(10, nodes="gpu-1")
    slurm.down = True
    with pytest.raises(SlurmUnavailable):
        run(CheckpointActivities(slurm).checkpoint_jobs, ask())
    slurm.down = False
    assert slurm.signals[10] == 0
