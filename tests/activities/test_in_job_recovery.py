"""In-job recovery inside the requeue step (activities/in_job.py), against the in-memory
Slurm of tests/fakes/systems.py:

- a job that announces a hot spare (`injob=` in its comment) loses the faulty node: it is
  marked, the node is released from its allocation (the victim fenced: nothing waits for
  its process), and its steps, not its batch shell, get the abandon signal (USR2); its
  survivors step again with the standby, without a requeue; a retried step does not act on
  it again; a node the job names as its standby (not in `training=`) is released without
  a signal or a wait;
- a fault on the job's batch host (Slurm never releases it) is requeued at once, with
  nothing released or signalled; so is a job left with fewer healthy nodes than it trains
  on (other nodes drained by incidents, or not answering), without waiting out the budget;
- two incidents on two training nodes of one job requeue it once in all, whatever the
  order their steps run in, and each records how the job went on;
- one that does not step again within the budget, or that Slurm will not shrink, is
  requeued, once, as the incident's requeue;
- a job without a spare, or a policy that says `requeue`, is requeued as before;
- an unreachable controller is an outage, not "no jobs".
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.in_job import ABANDON_SIGNAL
from autoclusters.activities.job_markers import in_job_marker
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import RequeueInput, RequeueResult, drain_reason
from autoclusters.integrations.slurm import SlurmUnavailable
from tests.fakes.systems import FakeSlurm

INCIDENT = "inc-20261202-060000-gpu-2"
OTHER = "inc-20261202-060000-gpu-3"
SPARE = "injob=/dev/shm/job-7"
FAULTY = "gpu-2"  # the incident's node; a job on gpu-[1-3] runs its batch script on gpu-1


def run(fn: Callable[[Any], Awaitable[Any]], arg: Any) -> Any:
    return asyncio.run(ActivityEnvironment().run(fn, arg))


def _input(
    node: str, incident: str, in_job: bool, budget_s: float, fault_at: float | None = None
) -> RequeueInput:
    return RequeueInput(
        node=node, incident_id=incident, poll_s=0.01, hold_watch_s=0.05,
        in_job=in_job, in_job_budget_s=budget_s, fault_at=fault_at,
    )  # fmt: skip


def requeue(
    slurm: FakeSlurm,
    *,
    in_job: bool = True,
    budget_s: float = 5,
    node: str = FAULTY,
    incident: str = INCIDENT,
    fault_at: float | None = None,
) -> RequeueResult:
    result: RequeueResult = run(
        SlurmActivities(slurm).requeue_jobs, _input(node, incident, in_job, budget_s, fault_at)
    )
    return result


async def requeue_async(
    slurm: FakeSlurm, node: str, incident: str, budget_s: float = 30
) -> RequeueResult:
    inp = _input(node, incident, True, budget_s)
    result: RequeueResult = await ActivityEnvironment().run(
        SlurmActivities(slurm).requeue_jobs, inp
    )
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
    assert out.recovery_path() == {7: "in-job"}
    # Marked, then the victim fenced (released from the job), then the survivors told:
    # USR2 to the job's steps, never to its batch shell (signal_job is scancel --batch).
    assert slurm.job_now(7).admin_comment == in_job_marker(INCIDENT, 0)
    assert slurm.log == [("shrink", "7:gpu-1,gpu-3"), ("signal_steps USR2", "7")]
    assert slurm.step_signals == [(7, ABANDON_SIGNAL)] and slurm.calls["signal_job"] == 0
    job = slurm.job_now(7)
    assert (job.job_state, job.restart_cnt, job.nodes) == ("RUNNING", 0, "gpu-1,gpu-3")
    assert slurm.node_now(FAULTY).state == "idle"
    assert "went on without the node" in out.describe()
    # A retry of the step (the worker died after the side effects): nothing again.
    again = requeue(slurm)
    assert again.in_job is not None and again.in_job.recovered == [7]
    assert slurm.calls["shrink_job"] == 1 and slurm.calls["signal_steps"] == 1
    assert slurm.requeue_count[7] == 0


def test_a_job_naming_new_training_nodes_re_formed_though_its_resumed_at_was_lost(
    slurm: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The survivors re-formed with the standby and rank 0 wrote `training=`, but its
    `resumed_at=` never landed (the signal ended the scontrol writing it, before the job
    shielded it): the job is stepping, not one to requeue once the budget runs out."""
    slurm.add_job(8, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-1,gpu-2")
    told = slurm.signal_steps

    async def re_forms(job_id: int, signal: str) -> None:
        await told(job_id, signal)
        slurm._jobs[job_id].comment = f"{SPARE} training=gpu-1,gpu-3"  # noqa: SLF001

    monkeypatch.setattr(slurm, "signal_steps", re_forms)
    out = requeue(slurm, budget_s=30)
    assert out.in_job is not None and out.in_job.recovered == [8], out.describe()
    assert slurm.requeue_count[8] == 0
    assert out.in_job.waited_s < 30


def test_a_standby_node_is_released_without_a_signal_or_a_wait(slurm: FakeSlurm) -> None:
    # gpu-2 is the job's standby: the training ranks never notice its loss, so no resume
    # comes and they are not told to re-form; the node is released and the job left alone.
    slurm.add_job(6, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-1,gpu-3")
    out = requeue(slurm, budget_s=30)
    assert out.in_job is not None and out.in_job.recovered == [6]
    assert out.in_job.waited_s < 5 and out.requeued == [] and slurm.requeue_count[6] == 0
    assert slurm.job_now(6).nodes == "gpu-1,gpu-3" and slurm.step_signals == []
    # So its plan costs the job nothing in place (a training node's loss costs the re-forming).
    in_place = out.plans[0].estimate("in-job")
    assert in_place is not None and in_place.possible and in_place.gpu_hours == 0
    other = FakeSlurm()
    for n in ("gpu-1", "gpu-2", "gpu-3"):
        other.add_node(n)
    other.add_job(9, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-1,gpu-2")
    other.in_job_recovering.add(9)
    trained = requeue(other).plans
    in_place = trained[0].estimate("in-job")
    assert in_place is not None and in_place.possible and in_place.gpu_hours > 0


def test_a_training_node_waits_for_the_resume(slurm: FakeSlurm) -> None:
    # Named as a training node, it is not a standby: told, no resume within the budget,
    # requeued.
    slurm.add_job(5, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-1,gpu-2")
    out = requeue(slurm, budget_s=0.05)
    assert slurm.step_signals == [(5, ABANDON_SIGNAL)]
    assert out.in_job is not None and "not stepping again within" in out.in_job.fell_back[5]
    assert out.requeued == [5]


def test_a_resume_from_just_before_the_fault_is_not_the_re_forming(slurm: FakeSlurm) -> None:
    """Faulted within a second of its first step: its generation 0's `resumed_at=` is
    within the fence's second of slack, but it was written before the runbook read the job;
    only a stamp written after that read is the survivors' re-forming (found by the holders'
    sandbox test: the job was "recovered" before it re-formed)."""
    just_now = time.time() - 0.5
    slurm.add_job(
        5, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-1,gpu-2 resumed_at={just_now:.3f}"
    )
    out = requeue(slurm, budget_s=0.05, fault_at=time.time())  # the incident opens after it
    assert out.in_job is not None and out.in_job.recovered == [], out.describe()
    assert "not stepping again within" in out.in_job.fell_back[5]
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


def test_a_job_slurm_will_not_shrink_falls_back_to_the_requeue(slurm: FakeSlurm) -> None:
    slurm.add_job(9, nodes="gpu-[1-2]", comment=SPARE)
    slurm.in_job_recovering.add(9)
    slurm.refuse_shrink = True
    out = requeue(slurm)
    assert out.in_job is not None and "Slurm refused" in out.in_job.fell_back[9]
    assert out.requeued == [9] and slurm.requeue_count[9] == 1
    assert slurm.step_signals == []  # nobody told to re-form around a node still in the job


@pytest.mark.parametrize("batch_host", ["gpu-2", None])
def test_a_fault_on_the_batch_host_is_requeued_at_once(
    slurm: FakeSlurm, batch_host: str | None
) -> None:
    """Slurm never releases the node that runs the batch script: decided from BatchHost
    before anything is released or signalled, the job goes straight to its one requeue.
    None: Slurm's default, the first node of the allocation (the fault then on gpu-1)."""
    slurm.add_job(13, nodes="gpu-[1-3]", comment=SPARE, batch_host=batch_host)
    slurm.in_job_recovering.add(13)  # it would step again, were it told to
    node = batch_host or "gpu-1"
    assert slurm.job_now(13).batch_host == node
    out = requeue(slurm, budget_s=30, node=node)
    assert out.in_job is not None and out.in_job.fell_back == {13: "the batch host: requeued"}
    assert out.in_job.waited_s < 5 and out.recovery_path() == {13: "requeue"}
    assert slurm.calls["shrink_job"] == 0 and slurm.calls["signal_steps"] == 0
    assert slurm.requeue_count[13] == 1 and slurm.release_count[13] == 1
    assert [what for what, _ in slurm.log] == ["requeue", "release_hold"]


@pytest.mark.parametrize(
    "other", ["drained by an incident", "not answering", "drained by an admin"]
)
def test_more_losses_than_standbys_requeue_at_once(slurm: FakeSlurm, other: str) -> None:
    """Training on gpu-2 and gpu-3, gpu-1 its standby: with gpu-3 lost too, one healthy node
    is left for two training seats, and no wait can help. A node an admin drained is not
    lost to the job (the job goes on in place: the control case)."""
    slurm.add_job(14, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-2,gpu-3")
    slurm.in_job_recovering.add(14)
    if other == "drained by an incident":
        slurm.set_reason("gpu-3", drain_reason(OTHER, "XID_79"))
    elif other == "not answering":
        slurm.add_node("gpu-3", state="allocated", state_flags=["NOT_RESPONDING"])
    else:
        slurm.set_reason("gpu-3", "maintenance window")
    out = requeue(slurm, budget_s=30)
    assert out.in_job is not None
    if other == "drained by an admin":
        assert out.in_job.recovered == [14] and slurm.requeue_count[14] == 0
        assert slurm.step_signals == [(14, ABANDON_SIGNAL)]
        return
    why = out.in_job.fell_back[14]
    assert why.startswith("more losses than standbys (gpu-2, gpu-3 lost, 1 left of the 2")
    assert out.in_job.waited_s < 5 and out.requeued == [14]
    assert slurm.requeue_count[14] == 1 and slurm.job_now(14).restart_cnt == 1
    assert slurm.calls["shrink_job"] == 0 and slurm.step_signals == []


class PausingSlurm(FakeSlurm):
    """Holds an incident's requeue marker (`pause_at` "mark": before it is written) or its
    requeue ("requeue") until the test lets it go (`gates`), to put two incidents' steps in
    a chosen order; says when a job's steps were signalled."""

    def __init__(self, pause_at: str = "requeue") -> None:
        super().__init__()
        self.pause_at = pause_at
        self.gates: dict[str, asyncio.Event] = {}
        self.arrived: dict[str, asyncio.Event] = {}
        self.signalled = asyncio.Event()

    def arrival(self, incident: str) -> asyncio.Event:
        return self.arrived.setdefault(incident, asyncio.Event())

    async def _pause(self, incident: str) -> None:
        if incident in self.gates:
            self.arrival(incident).set()
            await self.gates[incident].wait()

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        if self.pause_at == "mark" and ":requeue:" in text:
            await self._pause(text.rsplit(":", 2)[-2])
        await super().set_admin_comment(job_id, text)

    async def requeue(self, job_id: int) -> None:
        if self.pause_at == "requeue":
            await self._pause(self._jobs[job_id].admin_comment.rsplit(":", 2)[-2])
        await super().requeue(job_id)

    async def signal_steps(self, job_id: int, signal: str) -> None:
        await super().signal_steps(job_id, signal)
        self.signalled.set()


TWO_FAULTS = ["claimed", "both requeue", "in-job then requeue"]


@pytest.mark.parametrize("order", TWO_FAULTS)
def test_two_faults_on_one_job_requeue_it_once(order: str) -> None:
    """XID_79 on both training nodes (gpu-2, gpu-3) within a second, one standby (gpu-1,
    the batch host): the job is requeued once in all, whichever incident's step reads it
    first, and each incident records how the job went on (requeue).

    - claimed: gpu-3's step reads the job while gpu-2's has marked it and not yet requeued;
    - both requeue: both read it unclaimed and requeue it (Slurm refuses the second: "Job
      is pending execution"); the marker left is the second's, whose step releases the
      hold;
    - in-job then requeue: gpu-2's step ran before gpu-3's drain and released gpu-2; gpu-3's
      fault leaves one node for two seats."""

    async def scenario() -> tuple[PausingSlurm, RequeueResult, RequeueResult]:
        slurm = PausingSlurm(pause_at="mark" if order == "both requeue" else "requeue")
        for n in ("gpu-1", "gpu-2", "gpu-3"):
            slurm.add_node(n)
        slurm.add_job(20, nodes="gpu-[1-3]", comment=f"{SPARE} training=gpu-2,gpu-3")
        slurm.set_reason("gpu-2", drain_reason(INCIDENT, "XID_79"))
        if order != "in-job then requeue":
            slurm.set_reason("gpu-3", drain_reason(OTHER, "XID_79"))
        if order == "claimed":
            slurm.gates[INCIDENT] = asyncio.Event()
            first = asyncio.create_task(requeue_async(slurm, "gpu-2", INCIDENT))
            await slurm.arrival(INCIDENT).wait()
            second = await requeue_async(slurm, "gpu-3", OTHER)
            slurm.gates[INCIDENT].set()
            return slurm, await first, second
        if order == "both requeue":
            slurm.gates[INCIDENT], slurm.gates[OTHER] = asyncio.Event(), asyncio.Event()
            a = asyncio.create_task(requeue_async(slurm, "gpu-2", INCIDENT))
            b = asyncio.create_task(requeue_async(slurm, "gpu-3", OTHER))
            for incident in (INCIDENT, OTHER):
                await slurm.arrival(incident).wait()
            slurm.gates[INCIDENT].set()
            slurm.gates[OTHER].set()
            return slurm, await a, await b
        a = asyncio.create_task(requeue_async(slurm, "gpu-2", INCIDENT))
        await slurm.signalled.wait()  # gpu-2 released, survivors told; not stepping yet
        slurm.set_reason("gpu-3", drain_reason(OTHER, "XID_79"))
        b = await requeue_async(slurm, "gpu-3", OTHER)
        return slurm, await a, b

    slurm, first, second = asyncio.run(scenario())
    assert slurm.requeue_count[20] == 1 and slurm.job_now(20).restart_cnt == 1
    # A claimed job is left to its claimant: only a race Slurm settles sees a refusal.
    assert slurm.calls["requeue"] == (2 if order == "both requeue" else 1)
    assert first.recovery_path() == {20: "requeue"}, first.describe()
    assert second.recovery_path() == {20: "requeue"}, second.describe()
    assert first.in_job is not None and second.in_job is not None
    # Exactly one of them requeued it (its fallback), the other found it requeued.
    fell = [r.in_job.fell_back for r in (first, second) if r.in_job and r.in_job.fell_back]
    assert len(fell) == 1 and "more losses than standbys" in next(iter(fell[0].values()))
    elsewhere = first.in_job.requeued_elsewhere or second.in_job.requeued_elsewhere
    assert list(elsewhere) == [20]
    job = slurm.job_now(20)
    assert (job.job_state, job.state_reason) == ("PENDING", "None")  # its hold released


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
    assert slurm.log == [] and slurm.requeue_count[12] == 0
