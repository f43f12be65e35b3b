"""A job that requeues itself in the instant the runbook requeues it: a degraded node's job,
asked to checkpoint (train.sbatch's USR1), saves and runs `scontrol requeue` just as the
checkpoint budget runs out and the requeue step requeues it too. Slurm refuses the second
("Job is pending execution"); the job is pending on its own requeue's ~2 minute begin time.
Seen on the sandbox: the job stood 128 s before it stepped again. The requeue step counts
it as the incident's one requeue (its marker was set before the signal) and releases its
hold like any other; a refusal of any other kind still fails the step."""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.job_markers import requeue_marker
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import RequeueInput, RequeueResult, drain_reason
from autoclusters.integrations.slurm import SlurmError
from tests.fakes.systems import FakeSlurm

REASON = drain_reason("INC-1", "SLOW_NODE")


class RequeuesItselfFirst(FakeSlurm):
    """The job's own requeue lands a moment before the runbook's."""

    async def requeue(self, job_id: int) -> None:
        if self.job_now(job_id).job_state == "RUNNING":
            self.back_in_queue(job_id)
        await super().requeue(job_id)


class ReasonNotYetNamed(FakeSlurm):
    """Slurm shows the requeued job pending with no reason until its next scheduling pass;
    its eligible time already says it is held."""

    async def requeue(self, job_id: int) -> None:
        await super().requeue(job_id)
        self._job(job_id).state_reason = "None"


def _cluster(slurm: FakeSlurm) -> FakeSlurm:
    slurm.add_node("gpu-01", state="mixed", state_flags=["DRAIN"], reason=REASON)
    slurm.add_node("gpu-02")
    # Marked before the checkpoint signal, as activities/checkpoint.py does.
    slurm.add_job(101, nodes="gpu-[01-02]", admin_comment=requeue_marker("INC-1", 0))
    return slurm


def _requeue(slurm: FakeSlurm) -> RequeueResult:
    inp = RequeueInput(
        node="gpu-01", incident_id="INC-1", drain_reason=REASON, poll_s=0.01, hold_watch_s=0.05
    )
    run = ActivityEnvironment().run(SlurmActivities(slurm).requeue_jobs, inp)
    result: RequeueResult = asyncio.run(asyncio.wait_for(run, 30))
    return result


def test_a_job_that_requeued_itself_in_the_same_instant_is_released() -> None:
    slurm = _cluster(RequeuesItselfFirst())
    done = _requeue(slurm)
    assert done.requeued == [101] and done.requeued_itself == [101]
    assert done.requeued_now == []
    assert done.holds_released == [101]
    job = slurm.job_now(101)
    assert job.job_state == "PENDING" and job.eligible_time <= time.time() + 1  # not held
    assert slurm.requeue_count[101] == 0  # Slurm took one requeue: the job's own
    assert "requeued by themselves at that instant [101]" in done.describe()


def test_a_held_job_whose_reason_slurm_has_not_named_yet_is_released() -> None:
    slurm = _cluster(ReasonNotYetNamed())
    done = _requeue(slurm)
    assert done.requeued_now == [101] and done.holds_released == [101]
    assert slurm.job_now(101).eligible_time <= time.time() + 1


def test_any_other_refusal_still_fails_the_step() -> None:
    """The job still runs, unrequeued: the refusal is not a race, the step must not pass."""

    class Refuses(FakeSlurm):
        async def requeue(self, job_id: int) -> None:
            raise SlurmError(
                f"scontrol requeue {job_id}: Requested operation is presently disabled"
            )

    slurm = _cluster(Refuses())
    with pytest.raises(SlurmError, match="presently disabled"):
        _requeue(slurm)
    assert slurm.job_now(101).job_state == "RUNNING" and slurm.calls["release_hold"] == 0
