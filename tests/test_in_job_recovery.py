"""In-job recovery inside the requeue step (activities/in_job.py), against the in-memory
Slurm of tests/fakes.py:

- a job that announces a hot spare (`injob=` in its comment) loses the faulty node (its
  launcher there killed through `srun --overlap`, the node released from its allocation)
  and steps again without a requeue; a retried step does not act on it again; a node the
  job names as its standby (not in `training=`) is released without waiting for a resume;
- one that does not step again within the budget, or whose node Slurm will not let us
  reach, is requeued, once, as the incident's requeue;
- a job without a spare, or a policy that says `requeue`, is requeued as before;
- an unreachable controller is an outage, not "no jobs".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import RequeueInput, RequeueResult
from autoclusters.integrations.slurm import SlurmUnavailable
from tests.fakes import FakeSlurm

INCIDENT = "inc-20261202-060000-gpu-1"
SPARE = "injob=/dev/shm/job-7"


def run(fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Any:
    return asyncio.run(ActivityEnvironment().run(fn, arg))


def requeue(slurm: FakeSlurm, *, in_job: bool = True, budget_s: float = 5) -> RequeueResult:
    inp = RequeueInput(
        node="gpu-1", incident_id=INCIDENT, poll_s=0.01, hold_watch_s=0.05,
        in_job=in_job, in_job_budget_s=budget_s,
    )  # fmt: skip
    result: RequeueResult = run(SlurmActivities(slurm).requeue_jobs, inp)
    return result


@pytest.fixture
def slurm() -> FakeSlurm:
    s = FakeSlurm()
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        s.add_node(n)
    return s


def test_a_job_with_a_spare_goes_on_without_the_node(slurm: FakeSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]", comment=f"ckpt_at=1 {SPARE}")
    slurm.in_job_recovering.add(7)
    out = requeue(slurm)
    assert out.in_job is not None and out.in_job.recovered == [7]
    assert out.requeued == [] and slurm.requeue_count[7] == 0
    # Its launcher on the faulty node was killed, by the PID file the job announced.
    assert slurm.killed_on == {(7, "gpu-1"): 1}
    assert ('run_on_node kill -KILL "$(cat /dev/shm/job-7/gpu-1.pid)"', "7@gpu-1") in slurm.log
    job = slurm.job_now(7)
    assert (job.job_state, job.restart_cnt, job.nodes) == ("RUNNING", 0, "gpu-2,gpu-3")
    assert slurm.node_now("gpu-1").state == "idle"
    assert "went on without the node" in out.describe()
    # A retry of the step (the worker died after the side effects): nothing again.
    again = requeue(slurm)
    assert again.in_job is not None and again.in_job.recovered == [7]
    assert slurm.killed_on == {(7, "gpu-1"): 1} and slurm.calls["shrink_job"] == 1
    assert slurm.requeue_count[7] == 0


def test_a_standby_node_is_released_without_waiting_for_a_resume(slurm: FakeSlurm) -> None:
    # gpu-1 is the job's standby: the training ranks never notice its loss, so no resume
    # comes; the node is released and the job is left alone (no requeue, no wait).
    slurm.add_job(6, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-2,gpu-3")
    out = requeue(slurm, budget_s=30)
    assert out.in_job is not None and out.in_job.recovered == [6]
    assert out.in_job.waited_s < 5 and out.requeued == [] and slurm.requeue_count[6] == 0
    assert slurm.killed_on == {(6, "gpu-1"): 1} and slurm.job_now(6).nodes == "gpu-2,gpu-3"


def test_a_training_node_waits_for_the_resume(slurm: FakeSlurm) -> None:
    # Named as a training node, it is not a standby: no resume within the budget, requeued.
    slurm.add_job(5, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-1,gpu-2")
    out = requeue(slurm, budget_s=0.05)
    assert out.in_job is not None and "not stepping again within" in out.in_job.fell_back[5]
    assert out.requeued == [5]


def test_a_job_that_does_not_step_again_in_time_is_requeued_once(slurm: FakeSlurm) -> None:
    slurm.add_job(8, nodes="gpu-[1-2]", comment=SPARE)  # says it has a spare, but never resumes
    out = requeue(slurm, budget_s=0.05)
    assert out.in_job is not None and out.in_job.recovered == []
    assert "not stepping again within" in out.in_job.fell_back[8]
    assert out.requeued == [8] and slurm.requeue_count[8] == 1
    assert slurm.release_count[8] == 1  # its hold released like any requeue of ours
    requeue(slurm, budget_s=0.05)
    assert slurm.requeue_count[8] == 1  # never twice for one fault


def test_a_node_slurm_will_not_reach_falls_back_to_the_requeue(slurm: FakeSlurm) -> None:
    slurm.add_job(9, nodes="gpu-[1-2]", comment=SPARE)
    slurm.in_job_recovering.add(9)
    slurm.refuse_overlap = True
    out = requeue(slurm)
    assert out.in_job is not None and "Slurm refused" in out.in_job.fell_back[9]
    assert out.requeued == [9] and slurm.requeue_count[9] == 1
    assert slurm.calls["shrink_job"] == 0


@pytest.mark.parametrize("in_job", [True, False])
def test_without_a_spare_or_by_policy_the_job_is_requeued(slurm: FakeSlurm, in_job: bool) -> None:
    slurm.add_job(10, nodes="gpu-[1-2]")
    slurm.add_job(11, nodes="gpu-[1-3]", comment=SPARE)
    slurm.in_job_recovering.add(11)
    out = requeue(slurm, in_job=in_job)
    if in_job:
        assert out.in_job is not None and out.in_job.not_capable == [10]
        assert out.requeued == [10] and out.in_job.recovered == [11]
    else:
        assert out.in_job is None and sorted(out.requeued) == [10, 11]
    assert slurm.requeue_count[10] == 1


def test_an_unreachable_controller_is_an_outage_not_no_jobs(slurm: FakeSlurm) -> None:
    slurm.add_job(12, nodes="gpu-[1-2]", comment=SPARE)
    slurm.down = True
    with pytest.raises(SlurmUnavailable):
        requeue(slurm)
    slurm.down = False
    assert slurm.killed_on == {} and slurm.requeue_count[12] == 0
