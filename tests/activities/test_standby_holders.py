"""Standbys held outside the job (core/holders.py, activities/in_job.py, activities/holders.py),
against the in-memory Slurm of tests/fakes.py, with the policy's `standby_holders: 1`:

- a job's world is its allocation less a batch host that never trains (`launcher=1`) and
  the nodes of the holders claimed for its current run; a claim naming a run that ended or
  was requeued is stale, and the holder free again;
- a job that stepped again on its own standby is given a free holder (its claim written,
  its batch shell told with USR2);
- a second fault, on the node of the holder whose standby took the seat (Slurm lists only
  the holder there), is recovered in place: the holder is cancelled (the fence), the job's
  steps and those of its other holders are told to re-form, nothing is requeued;
- a holder that serves no job on a faulty node is cancelled, never requeued; one that ended
  meanwhile (Slurm refuses its cancel or its signal) is no reason to requeue its job;
- with no standby and no free holder the job is requeued at once, once;
- a requeued job's holders (claimed for the run that was requeued) are cancelled, so that
  the requeued run gets their nodes; a free holder, and a claim on a job's current run,
  are kept;
- a node returned to service gets a holder when fewer are free than the policy keeps, and
  a job without a standby is given it;
- with `standby_holders: 0` holders are left alone (the existing in-job path).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core import holders
from autoclusters.core.models import (
    RequeueInput,
    RequeueResult,
    ReturnInput,
    ReturnResult,
    SlurmJob,
    drain_reason,
)
from autoclusters.integrations.slurm import SlurmError
from tests.fakes.systems import FakeSlurm

INCIDENT = "inc-20261205-160000-gpu-2"
LAUNCHER_JOB = "injob=/dev/shm/train-7 launcher=1 holders=1"


class HolderSlurm(FakeSlurm):
    """FakeSlurm with holder jobs: submit one, write a Comment; and a training job whose
    survivors re-form on USR2 onto the seats `reform_to` names (train.py writes
    `training=` and `resumed_at=`)."""

    def __init__(self) -> None:
        super().__init__()
        self.reform_to: dict[int, str] = {}
        self.next_id = 100
        self.ended: set[int] = set()  # holders Slurm shows running that ended meanwhile

    async def cancel(self, job_id: int) -> None:
        if job_id in self.ended:
            raise SlurmError(f"scancel: Kill job error on job id {job_id}: already completed")
        await super().cancel(job_id)

    async def submit_holder(self, node: str) -> int:
        self.calls["submit_holder"] += 1
        self.next_id += 1
        self.add_job(self.next_id, nodes=node, name=holders.HOLDER_NAME, requeue=False,
                     comment=holders.holder_comment(None))  # fmt: skip
        self.record("submit_holder", node)
        return self.next_id

    async def set_comment(self, job_id: int, text: str) -> None:
        self.calls["set_comment"] += 1
        self._job(job_id).comment = text

    async def signal_steps(self, job_id: int, signal: str) -> None:
        if job_id in self.ended:
            raise SlurmError(f"scancel: Kill job error on job id {job_id}: already completed")
        await super().signal_steps(job_id, signal)
        if signal == "USR2" and job_id in self.reform_to:
            job = self._job(job_id)
            tokens = [t for t in job.comment.split() if not t.startswith("training=")]
            job.comment = " ".join(
                [*tokens, f"training={self.reform_to.pop(job_id)}", f"resumed_at={time.time()}"]
            )


def add_holder(slurm: HolderSlurm, job_id: int, node: str, served: SlurmJob | None) -> None:
    slurm.add_job(job_id, nodes=node, name=holders.HOLDER_NAME, requeue=False,
                  comment=holders.holder_comment(served))  # fmt: skip


@pytest.fixture
def slurm() -> HolderSlurm:
    s = HolderSlurm()
    for i in range(1, 6):
        s.add_node(f"gpu-{i}")
    return s


def requeue(slurm: FakeSlurm, node: str, standby_holders: int = 1) -> RequeueResult:
    """The requeue step of an incident of its own on `node`."""
    inp = RequeueInput(
        node=node, incident_id=f"{INCIDENT}-{node}", poll_s=0.01, hold_watch_s=0.05, in_job=True,
        in_job_budget_s=5, standby_holders=standby_holders,
    )  # fmt: skip
    out: RequeueResult = asyncio.run(
        ActivityEnvironment().run(SlurmActivities(slurm).requeue_jobs, inp)
    )
    return out


def back_in_service(slurm: FakeSlurm, node: str) -> ReturnResult:
    slurm.set_reason(node, drain_reason(INCIDENT, "XID_79"))
    inp = ReturnInput(node=node, incident_id=INCIDENT, poll_s=0.01, standby_holders=1)
    out: ReturnResult = asyncio.run(
        ActivityEnvironment().run(SlurmActivities(slurm).return_to_service, inp)
    )
    return out


def job(slurm: FakeSlurm, job_id: int) -> SlurmJob:
    return slurm.job_now(job_id)


def jobs(slurm: FakeSlurm) -> list[SlurmJob]:
    out: list[SlurmJob] = asyncio.run(slurm.jobs())
    return out


# --- the decisions (core/holders.py) ---------------------------------------------------------


def test_a_jobs_world_is_its_seats_and_its_holders(slurm: HolderSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]", comment=f"{LAUNCHER_JOB} training=gpu-2,gpu-3")
    add_holder(slurm, 20, "gpu-5", job(slurm, 7))
    add_holder(slurm, 21, "gpu-4", None)
    everyone = jobs(slurm)
    # The batch host gpu-1 only launches; gpu-5's holder is the job's; gpu-4's is free.
    assert holders.world(job(slurm, 7), everyone) == ["gpu-2", "gpu-3", "gpu-5"]
    assert holders.standbys(job(slurm, 7), everyone, set()) == 1
    assert holders.standbys(job(slurm, 7), everyone, {"gpu-5"}) == 0
    assert [h.job_id for h in holders.free(everyone)] == [21]
    assert holders.to_submit(everyone, 1) == 0 and holders.to_submit(everyone, 2) == 1
    # The job requeued (its restart count moved): its claim on gpu-5 is stale.
    slurm._jobs[7].restart_cnt = 1  # noqa: SLF001
    everyone = jobs(slurm)
    assert [h.job_id for h in holders.free(everyone)] == [20, 21]
    assert holders.world(job(slurm, 7), everyone) == ["gpu-2", "gpu-3"]


def test_a_stale_training_token_does_not_hide_a_used_standby(slurm: HolderSlurm) -> None:
    """Just after gpu-2 was taken from the job (shrunk to gpu-1,gpu-3), before the re-formed
    group rewrote `training=` (still gpu-2,gpu-3): gpu-1, the standby that took the seat,
    is not counted as free."""
    slurm.add_job(8, nodes="gpu-1,gpu-3", comment="injob=/d holders=1 training=gpu-2,gpu-3")
    everyone = jobs(slurm)
    assert holders.standbys(job(slurm, 8), everyone, {"gpu-2"}) == 0
    assert holders.lacks_standby(job(slurm, 8), everyone, {"gpu-2"})


def test_without_launcher_or_holders_tokens_nothing_changes(slurm: HolderSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]", comment="injob=/d training=gpu-1,gpu-2")
    add_holder(slurm, 20, "gpu-5", job(slurm, 7))  # a claim for a job that takes none
    everyone = jobs(slurm)
    assert holders.world(job(slurm, 7), everyone) == ["gpu-1", "gpu-2", "gpu-3"]
    assert not holders.lacks_standby(job(slurm, 7), everyone, {"gpu-3"})
    assert [h.job_id for h in holders.free(everyone)] == [20]


# --- the runbook ----------------------------------------------------------------------------


def test_a_second_fault_is_recovered_in_place_from_a_holder(slurm: HolderSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-4]", comment=f"{LAUNCHER_JOB} training=gpu-2,gpu-3")
    add_holder(slurm, 20, "gpu-5", None)
    # First fault: gpu-2. Its own standby gpu-4 takes the seat; the job is then given
    # the free holder and its batch shell told.
    slurm.reform_to[7] = "gpu-3,gpu-4"
    first = requeue(slurm, "gpu-2")
    assert first.in_job is not None and first.in_job.recovered == [7]
    assert first.in_job.holders_given == {7: 20}
    assert slurm.requeue_count[7] == 0
    assert holders.served_by(job(slurm, 20), jobs(slurm)) is not None
    assert ("signal USR2", "7") in slurm.log  # the batch shell: launch into the holder
    assert job(slurm, 7).nodes == "gpu-1,gpu-3,gpu-4"
    # gpu-2 is repaired and returned: a new free holder on it (the pool keeps 1).
    back = back_in_service(slurm, "gpu-2")
    assert back.returned and "submitted on gpu-2" in back.detail
    (fresh,) = [h for h in holders.free(jobs(slurm))]
    assert fresh.nodes == "gpu-2"
    # Second fault: gpu-4, the standby that took a seat. The holder's standby (gpu-5)
    # takes it: in place again, no requeue.
    slurm.log.clear()
    slurm.reform_to[7] = "gpu-3,gpu-5"
    second = requeue(slurm, "gpu-4")
    assert second.in_job is not None and second.in_job.recovered == [7]
    assert second.requeued == [] and slurm.requeue_count[7] == 0
    assert second.in_job.holders_given == {7: fresh.job_id}
    # Third fault: gpu-5, where the job's rank runs in holder 20 (Slurm lists only the
    # holder there): the holder is cancelled (the fence), the job's steps and its other
    # holder's are told, and nothing is shrunk or requeued.
    slurm.log.clear()
    slurm.reform_to[7] = "gpu-2,gpu-3"
    third = requeue(slurm, "gpu-5")
    assert third.in_job is not None and third.in_job.recovered == [7]
    assert third.in_job.holders_cancelled == [20] and job(slurm, 20).job_state == "CANCELLED"
    assert ("signal_steps USR2", "7") in slurm.log
    assert ("signal_steps USR2", str(fresh.job_id)) in slurm.log
    assert slurm.calls["shrink_job"] == 2  # the first two faults only
    assert third.requeued == [] and slurm.requeue_count[7] == 0
    assert third.not_requeueable == []


def test_a_holder_that_ended_meanwhile_is_no_reason_to_requeue(slurm: HolderSlurm) -> None:
    """The job trains on gpu-3 and, in holder 20, on gpu-5; holder 21 (gpu-4) holds its
    standby. Slurm still shows 21 running but it has ended: its refusal of the signal is
    not the job's failure."""
    slurm.add_job(7, nodes="gpu-[1,3]", comment=f"{LAUNCHER_JOB} training=gpu-3,gpu-5")
    add_holder(slurm, 20, "gpu-5", job(slurm, 7))
    add_holder(slurm, 21, "gpu-4", job(slurm, 7))
    slurm.ended.add(21)
    slurm.reform_to[7] = "gpu-4,gpu-5"
    out = requeue(slurm, "gpu-3")
    assert out.in_job is not None and out.in_job.recovered == [7]
    assert ("signal_steps USR2", "20") in slurm.log and slurm.requeue_count[7] == 0


def test_a_fence_on_a_holder_that_ended_is_done(slurm: HolderSlurm) -> None:
    """The fault's node runs the job's rank in holder 20, which Slurm refuses to cancel (it
    ended meanwhile, and its step with it): the job goes on in place all the same."""
    slurm.add_job(7, nodes="gpu-[1,3]", comment=f"{LAUNCHER_JOB} training=gpu-3,gpu-5")
    add_holder(slurm, 20, "gpu-5", job(slurm, 7))
    add_holder(slurm, 21, "gpu-4", job(slurm, 7))
    slurm.ended.add(20)
    slurm.reform_to[7] = "gpu-3,gpu-4"
    out = requeue(slurm, "gpu-5")
    assert out.in_job is not None and out.in_job.recovered == [7]
    assert out.in_job.fell_back == {} and slurm.requeue_count[7] == 0
    assert ("signal_steps USR2", "21") in slurm.log  # its other holder, told too


def test_a_holder_serving_nobody_on_a_faulty_node_is_cancelled(slurm: HolderSlurm) -> None:
    add_holder(slurm, 20, "gpu-5", None)
    out = requeue(slurm, "gpu-5")
    assert out.in_job is not None and out.in_job.holders_cancelled == [20]
    assert out.requeued == [] and out.not_requeueable == [] and slurm.requeue_count[20] == 0


def test_no_standby_and_no_free_holder_is_requeued_at_once(slurm: HolderSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]", comment=f"{LAUNCHER_JOB} training=gpu-2,gpu-3")
    started = time.monotonic()
    out = requeue(slurm, "gpu-2")
    assert out.in_job is not None and 7 in out.in_job.fell_back
    assert "more losses than standbys" in out.in_job.fell_back[7]
    assert slurm.requeue_count[7] == 1 and time.monotonic() - started < 5  # not the budget


def test_a_requeued_jobs_holders_are_cancelled_for_its_new_run(slurm: HolderSlurm) -> None:
    # Job 7 used its own standby and was given holder 20 (gpu-4); holder 21 (gpu-5) is free.
    slurm.add_job(7, nodes="gpu-[1-3]", comment=f"{LAUNCHER_JOB} training=gpu-2,gpu-3")
    add_holder(slurm, 20, "gpu-4", job(slurm, 7))
    add_holder(slurm, 21, "gpu-5", None)
    # A fault on its batch host, the launcher: requeued at once. Its new run asks for three
    # nodes again, and holder 20 would keep one of the four left from it for good.
    out = requeue(slurm, "gpu-1")
    assert slurm.requeue_count[7] == 1 and out.requeued == [7]
    assert out.holders_released == [20] and job(slurm, 20).job_state == "CANCELLED"
    assert job(slurm, 21).job_state == "RUNNING"  # free: the pool keeps it
    assert "holders [20] of the requeued runs cancelled" in out.describe()


def test_only_claims_on_an_earlier_run_of_a_requeued_job_are_released() -> None:
    def held(job_id: int, claim: str | None) -> SlurmJob:
        comment = f"holder=1 holder_for={claim}" if claim else "holder=1"
        return SlurmJob(job_id=job_id, name=holders.HOLDER_NAME, job_state="RUNNING",
                        nodes=f"gpu-{job_id}", comment=comment)  # fmt: skip

    training = SlurmJob(job_id=7, name="train", job_state="RUNNING", nodes="gpu-1", restart_cnt=2)
    other = SlurmJob(job_id=8, name="train", job_state="RUNNING", nodes="gpu-9", restart_cnt=0)
    pool = [training, other, held(1, "7.1"), held(2, "7.2"), held(3, None), held(4, "8.0"),
            held(5, "x.y")]  # fmt: skip
    # 7.1 is the run before the requeue: released. 7.2 is the new run's own claim, 8.0 a
    # job that was not requeued, the others no claim at all: kept.
    assert [h.job_id for h in holders.claimed_by_earlier_runs(pool, {7})] == [1]
    assert holders.claimed_by_earlier_runs(pool, set()) == []


def test_a_returned_node_gives_a_job_without_a_standby_its_holder(slurm: HolderSlurm) -> None:
    slurm.add_job(7, nodes="gpu-[1-3]", comment=f"{LAUNCHER_JOB} training=gpu-2,gpu-3")
    back = back_in_service(slurm, "gpu-4")
    (held,) = [j for j in jobs(slurm) if holders.is_holder(j)]
    assert held.nodes == "gpu-4" and "given to job 7" in back.detail
    assert holders.served_by(held, jobs(slurm)) is not None
    assert slurm.signals[7] == 1  # its batch shell: launch into it
    # Returned again (another node) with the holder claimed: the pool is short again.
    back_in_service(slurm, "gpu-5")
    assert len(holders.free(jobs(slurm))) == 1


def test_a_job_that_requeued_itself_gets_its_nodes_back_at_the_next_return(
    slurm: HolderSlurm,
) -> None:
    """The 30-minute ETTR run's stall: job 7 was given holders 20 and 21 for its first run,
    then its in-job recovery failed and it requeued itself (no requeue step of ours saw
    it); a node returned meanwhile got holder 22. The requeued run, asking for its full
    width again, waited on Resources behind three holders where the pool keeps one. The
    next return to service cancels the claims on the earlier run and keeps the pool at its
    target."""
    run0 = SlurmJob(job_id=7, name="train", job_state="RUNNING", nodes="gpu-[1-2]", restart_cnt=0,
                    comment=f"{LAUNCHER_JOB} training=gpu-2,gpu-3")  # fmt: skip
    slurm.add_job(7, nodes="", job_state="PENDING", restart_cnt=1, comment=LAUNCHER_JOB)
    add_holder(slurm, 20, "gpu-3", run0)
    add_holder(slurm, 21, "gpu-4", run0)
    add_holder(slurm, 22, "gpu-5", None)
    back = back_in_service(slurm, "gpu-2")
    assert [job(slurm, h).job_state for h in (20, 21, 22)] == ["CANCELLED", "CANCELLED", "RUNNING"]
    assert "holders [20, 21] of earlier runs cancelled" in back.detail
    assert slurm.calls["submit_holder"] == 0  # 22 is the pool's one free holder


def test_free_holders_past_the_pool_are_cancelled_newest_first(slurm: HolderSlurm) -> None:
    # Three free holders (the job they served ended); the pool keeps one: the oldest.
    for job_id, node in ((20, "gpu-3"), (21, "gpu-4"), (22, "gpu-5")):
        add_holder(slurm, job_id, node, None)
    back = back_in_service(slurm, "gpu-2")
    assert [job(slurm, h).job_state for h in (20, 21, 22)] == ["RUNNING", "CANCELLED", "CANCELLED"]
    assert "holders [21, 22] beyond the pool's 1 cancelled" in back.detail
    assert slurm.calls["submit_holder"] == 0


def test_without_the_policy_holders_are_left_alone(slurm: HolderSlurm) -> None:
    add_holder(slurm, 20, "gpu-5", None)
    out = requeue(slurm, "gpu-5", standby_holders=0)
    assert out.in_job is not None and out.in_job.holders_cancelled == []
    assert job(slurm, 20).job_state == "RUNNING" and out.not_requeueable == [20]
    inp: Any = ReturnInput(node="gpu-4", incident_id=INCIDENT, poll_s=0.01)
    slurm.set_reason("gpu-4", drain_reason(INCIDENT, "XID_79"))
    asyncio.run(ActivityEnvironment().run(SlurmActivities(slurm).return_to_service, inp))
    assert slurm.calls["submit_holder"] == 0
