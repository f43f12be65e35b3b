"""The measured loss beside the estimate (issue 42; core/recovery_loss.py,
activities/recovery_loss.py):

- the arithmetic: stepping again from the incident's opening, the work redone from the
  checkpoint the new run started from (none in place, none after a save on the requeue's
  signal), GPU-hours, and the estimate it is judged by;
- unknown is said, never counted as no loss (a restart from a checkpoint nobody said still
  gives its seconds to stepping again); a job that says how it trains is followed before
  its first checkpoint;
- how good the estimates have been (median, worst, within ±30 %);
- the measuring step on a fake Slurm: a requeued job followed until its new run says it
  steps, the checkpoint read before that first step, a job that says nothing not waited
  for, a job that never steps again unknown after the budget.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.in_job import plan_for
from autoclusters.activities.recovery_loss import RecoveryLossActivities
from autoclusters.core.models import SlurmJob
from autoclusters.core.recovery_cost import JobFacts, RecoveryFigures, RecoveryPlan, plan_recovery
from autoclusters.core.recovery_loss import (
    JobSighting,
    MeasureRecoveryInput,
    MeasureRecoveryResult,
    RecoveryLoss,
    WatchedJob,
    actual_loss,
    estimate_quality,
    loss_text,
)
from tests.fakes.systems import FakeSlurm

FIGURES = RecoveryFigures(in_job_s=1.5, requeue_s=20)
OPENED = 1_800_000_000.0


def _plan(*, in_job: bool, ckpt_age: float = 30) -> RecoveryPlan:
    return plan_recovery(
        JobFacts(
            job_id=7,
            gpus=16,
            checkpoint_age_s=ckpt_age,
            checkpoint_at=OPENED - ckpt_age,
            in_job_blocked=None if in_job else "no standby",
            free_nodes=2,
            restart_cnt=0,
        ),
        FIGURES,
    )


def test_a_requeue_loses_the_wait_and_the_work_since_the_checkpoint_it_started_from() -> None:
    plan = _plan(in_job=False)
    seen = JobSighting(job_id=7, stepping_at=OPENED + 25, resumed_ckpt_at=OPENED - 30,
                       restarted=True)  # fmt: skip
    loss = actual_loss(plan, "requeue", seen, OPENED)
    assert (loss.resume_s, loss.redo_s) == (25, 30)
    assert loss.actual_gpu_hours == pytest.approx(16 * (25 + 30) / 3600)
    assert loss.estimated_path == "requeue"
    assert loss.estimate_gpu_hours == pytest.approx(16 * (20 + 30) / 3600)
    assert loss.error == pytest.approx((55 - 50) / 55)
    assert "estimated 0.222 GPU-h (requeue), actual 0.244 GPU-h" in loss.describe()


def test_a_save_on_the_requeues_signal_redoes_nothing() -> None:
    seen = JobSighting(job_id=7, stepping_at=OPENED + 20, resumed_ckpt_at=OPENED + 2,
                       restarted=True)  # fmt: skip
    loss = actual_loss(_plan(in_job=False), "requeue", seen, OPENED)
    assert loss.redo_s == 0 and loss.resume_s == 20


def test_in_place_nothing_is_redone_and_the_in_job_estimate_judges_it() -> None:
    seen = JobSighting(job_id=7, stepping_at=OPENED + 1.2)
    loss = actual_loss(_plan(in_job=True), "in-job", seen, OPENED)
    assert (loss.resume_s, loss.redo_s) == (1.2, 0)
    assert loss.estimated_path == "in-job"
    assert loss.error == pytest.approx((1.2 - 1.5) / 1.2)


def test_unknown_is_said_not_counted_as_no_loss() -> None:
    seen = JobSighting(job_id=7, why_unknown="ended before it stepped again")
    loss = actual_loss(_plan(in_job=False), "requeue", seen, OPENED)
    assert loss.actual_gpu_hours is None and loss.error is None
    assert "actual unknown (ended before it stepped again)" in loss_text([loss])
    # A restart whose checkpoint nobody said: unknown too, not "nothing redone"; its
    # seconds to stepping again are measured all the same (the path's figure needs them).
    plan = plan_recovery(JobFacts(job_id=7, gpus=8), FIGURES)
    silent = JobSighting(job_id=7, stepping_at=OPENED + 20, restarted=True)
    unsaid = actual_loss(plan, "requeue", silent, OPENED)
    assert unsaid.actual_gpu_hours is None and unsaid.error is None
    assert unsaid.resume_s == 20 and unsaid.redo_s is None
    assert "(no ckpt_at=); stepping again after 20.0s" in unsaid.describe()


def test_a_job_that_says_how_it_trains_is_measured_before_its_first_checkpoint() -> None:
    def job(comment: str) -> SlurmJob:
        return SlurmJob(job_id=7, job_state="RUNNING", nodes="gpu-[01-03]", comment=comment)

    fresh = plan_for(job("injob=/ckpt training=gpu-01,gpu-02"), "the batch host", FIGURES, OPENED)
    assert fresh.checkpoint_at is None and fresh.says_progress
    silent = plan_for(job(""), "no standby", FIGURES, OPENED)
    assert not silent.says_progress


def test_a_run_that_started_from_an_older_checkpoint_risks_only_its_own_work() -> None:
    """A requeued run started from the old run's save, or from none, and was faulted 4 s
    after its first step (`run_at=`): the estimate and the measured loss both count the 4 s
    it will redo, not the time since that save (the requeue between them redid nothing),
    and not none (issue 42's miss: a fault before the run's first checkpoint)."""

    def job(comment: str) -> SlurmJob:
        return SlurmJob(job_id=7, job_state="RUNNING", nodes="gpu-[01-02]", gpus=16,
                        restart_cnt=3, comment=comment)  # fmt: skip

    fault = OPENED
    for comment, resumed_from in [
        (f"ckpt_at={fault - 40:.3f} run_at={fault - 4:.3f}", fault - 40),  # the old save
        (f"run_at={fault - 4:.3f}", None),  # it never saved: started from nothing
    ]:
        plan = plan_for(job(comment), "no standby", FIGURES, fault)
        assert plan.checkpoint_age_s == pytest.approx(4) and plan.says_progress
        requeue = plan.estimate("requeue")
        assert requeue is not None and requeue.redo_s == pytest.approx(4)
        seen = JobSighting(job_id=7, stepping_at=fault + 18, resumed_ckpt_at=resumed_from,
                           restarted=True)  # fmt: skip
        loss = actual_loss(plan, "requeue", seen, fault)
        assert (loss.resume_s, loss.redo_s) == (18, pytest.approx(4))
        assert loss.error == pytest.approx((22 - 24) / 22)
    # A save newer than the run's first step is where its work at risk begins.
    newer = plan_for(job(f"run_at={fault - 30:.3f} ckpt_at={fault - 6:.3f}"), "x", FIGURES, fault)
    assert newer.checkpoint_age_s == pytest.approx(6)


def test_how_good_the_estimates_have_been() -> None:
    def loss(est: float, actual: float | None) -> RecoveryLoss:
        return RecoveryLoss(job_id=1, path="requeue", gpus=8, estimate_gpu_hours=est,
                            actual_gpu_hours=actual)  # fmt: skip

    q = estimate_quality([loss(1.0, 1.0), loss(1.2, 1.0), loss(0.5, 1.0), loss(1.0, None)])
    assert (q.measured, q.unknown, q.within) == (3, 1, 2)  # 0 %, -20 %, +50 % off
    assert q.median_error == pytest.approx(0.2) and q.worst_error == pytest.approx(0.5)
    assert q.within_share == pytest.approx(2 / 3)
    assert estimate_quality([]).median_error is None


def _measure(
    slurm: FakeSlurm,
    inp: MeasureRecoveryInput,
    then: Callable[[FakeSlurm], None] | None = None,
) -> MeasureRecoveryResult:
    """Run the measuring step; `then(slurm)` once it has read the jobs twice (the job's
    own processes writing while the runbook watches)."""

    async def scenario() -> MeasureRecoveryResult:
        task = asyncio.ensure_future(
            ActivityEnvironment().run(RecoveryLossActivities(slurm).measure_recovery, inp)
        )
        if then is not None:
            while slurm.calls["jobs"] < 2 and not task.done():
                await asyncio.sleep(0.005)  # the condition: the step has polled twice
            then(slurm)
        return await task

    return asyncio.run(scenario())


def test_a_requeued_job_is_followed_until_its_new_run_steps() -> None:
    slurm = FakeSlurm()
    opened = time.time() - 5
    ckpt = opened - 40
    # Its new run is running and has not stepped yet; its old run's newest save is shown.
    slurm.add_job(7, nodes="gpu-[3-4]", restart_cnt=1, comment=f"ckpt_at={ckpt:.0f}")
    slurm.add_job(8, nodes="gpu-5", restart_cnt=1)  # says nothing of itself
    inp = MeasureRecoveryInput(
        jobs=[
            WatchedJob(job_id=7, path="requeue", restart_cnt=0, says_checkpoints=True),
            WatchedJob(job_id=8, path="requeue", restart_cnt=0, says_checkpoints=False),
        ],
        opened_at=opened,
        budget_s=30,
        poll_s=0.01,
    )
    stepped = opened + 12

    def first_step(s: FakeSlurm) -> None:  # and its first save since, read in the same poll
        s.set_comment(7, f"ckpt_at={stepped + 5:.0f} resumed_at={stepped:.3f}")

    out = _measure(slurm, inp, first_step)
    seen = {x.job_id: x for x in out.seen}
    assert seen[7].stepping_at == pytest.approx(stepped)
    # The save after its first step is the new run's: the one read before it counts.
    assert seen[7].resumed_ckpt_at == float(f"{ckpt:.0f}") and seen[7].restarted
    assert seen[8].stepping_at is None and "no ckpt_at=" in seen[8].why_unknown


def test_a_job_that_never_steps_again_is_unknown_after_the_budget() -> None:
    slurm = FakeSlurm()
    opened = time.time()
    slurm.add_job(7, nodes="gpu-1", job_state="PENDING", restart_cnt=1,
                  comment=f"ckpt_at={opened - 9:.0f}")  # fmt: skip
    slurm.add_job(9, nodes="gpu-2", comment=f"resumed_at={opened + 1.1:.3f}")
    inp = MeasureRecoveryInput(
        jobs=[
            WatchedJob(job_id=7, path="requeue", says_checkpoints=True),
            WatchedJob(job_id=9, path="in-job", says_checkpoints=True),
        ],
        opened_at=opened,
        budget_s=0.05,
        poll_s=0.01,
    )
    out = _measure(slurm, inp)
    seen = {x.job_id: x for x in out.seen}
    assert seen[7].stepping_at is None and "within 0s" in seen[7].why_unknown
    assert seen[9].stepping_at == pytest.approx(opened + 1.1)  # in place: read once
