"""A requeue on a node that cannot end the job: it does not answer (power, a kernel panic, its
link down) and slurmctld keeps the requeued job completing there until its RPC timeouts and
SlurmdTimeout have passed, or its rank is stuck (a GPU rank hung in the driver outlives
SIGKILL until the reboot). The incident's node is its own to repair: the requeue step marks
it DOWN, its drain and reason kept, so the job ends there and starts elsewhere at once. Only
where DOWN ends nothing else and the node comes back by itself after its repair; a node
that ends the job in time is never marked down."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import RequeueInput, RequeueResult, drain_reason
from autoclusters.integrations.slurm import SlurmError, config_value
from tests.fakes.systems import FakeSlurm

REASON = drain_reason("INC-1", "NODE_NOT_READY")
FOREVER = 1_000_000  # reads for which Slurm shows the job completing: until SlurmdTimeout


def _requeue(slurm: FakeSlurm, fence_after_s: float | None = 3.0) -> RequeueResult:
    inp = RequeueInput(
        node="gpu-01", incident_id="INC-1", drain_reason=REASON, poll_s=0.01, hold_watch_s=0.05,
        fence_after_s=fence_after_s,
    )  # fmt: skip
    run = ActivityEnvironment().run(SlurmActivities(slurm).requeue_jobs, inp)
    result: RequeueResult = asyncio.run(asyncio.wait_for(run, 30))
    return result


def _cluster(answering: bool, completing_reads: int, reason: str = REASON) -> FakeSlurm:
    slurm = FakeSlurm()
    flags = ["DRAIN"] if answering else ["DRAIN", "NOT_RESPONDING"]
    slurm.add_node("gpu-01", state="mixed", state_flags=flags, reason=reason)
    slurm.add_node("gpu-02")
    slurm.add_job(101, nodes="gpu-[01-02]")
    slurm.completing_reads[101] = completing_reads
    return slurm


def test_a_lost_node_is_marked_down_so_its_requeued_job_ends_there() -> None:
    slurm = _cluster(answering=False, completing_reads=FOREVER)
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


def test_a_node_whose_rank_is_stuck_is_marked_down_once_the_job_overstays() -> None:
    """The node answers, but the requeued job does not end there (its rank is stuck): DOWN
    once it has been completing for `fence_after_s`, not before."""
    slurm = _cluster(answering=True, completing_reads=FOREVER)
    started = time.monotonic()
    done = _requeue(slurm, fence_after_s=0.3)
    assert done.marked_down and slurm.calls["mark_down"] == 1
    assert time.monotonic() - started >= 0.3
    assert slurm.node_now("gpu-01").reason == REASON


def test_fence_at_once_marks_down_as_soon_as_the_job_completes_there() -> None:
    """`fence: at_once` (fence_after_s 0: a GPU fallen off the bus, whose rank SIGKILL does
    not free): the node answers, and is marked DOWN at the first read that shows the
    requeued job completing there, after the requeue; the other conditions still hold."""
    slurm = _cluster(answering=True, completing_reads=FOREVER)
    done = _requeue(slurm, fence_after_s=0)
    assert done.marked_down and slurm.calls["mark_down"] == 1
    assert slurm.log.index(("requeue", "101")) < slurm.log.index(("mark_down", "gpu-01"))
    assert slurm.node_now("gpu-01").reason == REASON
    # Another job on the node (one that cannot be requeued) still keeps it up.
    slurm = _cluster(answering=True, completing_reads=30)
    slurm.add_job(202, nodes="gpu-01", requeue=False)
    done = _requeue(slurm, fence_after_s=0)
    assert not done.marked_down and slurm.calls["mark_down"] == 0


def test_the_jobs_are_held_over_the_down_and_let_go_from_a_read_after_it() -> None:
    """DOWN ends the requeued job's completing with none of a requeue's begin-time delay: on
    real Slurm the scheduler started it again within the second of its kill, on a node that
    had just revoked its credential, and it FAILED ("Job credential revoked"; ci12 of
    2026-12-06). The fence holds it first and lets it go once that second has passed."""
    slurm = _cluster(answering=True, completing_reads=FOREVER)
    done = _requeue(slurm, fence_after_s=0)
    order = [slurm.log.index(w) for w in [("requeue", "101"), ("hold", "101"),
             ("mark_down", "gpu-01"), ("release_hold", "101"), ("release", "101")]]  # fmt: skip
    assert order == sorted(order)
    # Released from a read after the DOWN: the client's start waits out that read's second.
    assert slurm.pending_seen_at[101] > slurm.when[("mark_down", "gpu-01")]
    job = slurm.job_now(101)
    assert (job.job_state, job.state_reason) == ("PENDING", "None")  # free to start
    assert done.marked_down and done.holds_released == [101] and done.fence_held == []


def test_a_retry_lets_go_of_the_holds_an_earlier_attempt_placed() -> None:
    """The worker died between the hold and its release: its heartbeats named the held job,
    and the retry releases it (a job held by nobody's wish would never run again)."""
    slurm = _cluster(answering=True, completing_reads=FOREVER)
    beats: list[Any] = []
    first = ActivityEnvironment()
    first.on_heartbeat = lambda *details: beats.extend(details)
    real_mark_down = slurm.mark_down

    async def worker_dies(node: str, reason: str) -> None:
        await real_mark_down(node, reason)
        raise asyncio.CancelledError  # the attempt ends here, the job still held

    slurm.mark_down = worker_dies  # type: ignore[method-assign]
    inp = RequeueInput(
        node="gpu-01", incident_id="INC-1", drain_reason=REASON, poll_s=0.01, hold_watch_s=0.05,
        fence_after_s=0,
    )  # fmt: skip
    acts = SlurmActivities(slurm)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(first.run(acts.requeue_jobs, inp))
    assert slurm.job_now(101).state_reason == "JobHeldAdmin"
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(retry.info, attempt=2, heartbeat_details=beats[-1:])
    done = asyncio.run(asyncio.wait_for(retry.run(acts.requeue_jobs, inp), 30))
    assert slurm.job_now(101).state_reason == "None" and ("release", "101") in slurm.log
    assert done.holds_released == [101] and done.fence_held == []
    assert slurm.requeue_count[101] == 1  # and never a second requeue


def test_a_release_that_did_not_take_is_sent_again() -> None:
    """`scontrol release` answered but the job still shows held: read back, not assumed;
    the watch releases it again rather than leave a job that would never run."""
    slurm = _cluster(answering=True, completing_reads=FOREVER)
    real_release = slurm.release
    calls: list[int] = []

    async def lost_once(job_id: int) -> None:
        calls.append(job_id)
        if len(calls) > 1:
            await real_release(job_id)

    slurm.release = lost_once  # type: ignore[method-assign]
    done = _requeue(slurm, fence_after_s=0)
    assert calls == [101, 101]
    assert slurm.job_now(101).state_reason == "None" and done.fence_held == []


def test_no_down_when_the_hold_is_refused() -> None:
    """A job that cannot be held (it ended meanwhile, the controller is away) gets no DOWN
    that could start it again too soon."""
    slurm = _cluster(answering=False, completing_reads=30)

    async def refused(job_id: int) -> None:
        raise SlurmError(f"scontrol hold {job_id}: Job is no longer pending execution")

    slurm.hold = refused  # type: ignore[method-assign]
    done = _requeue(slurm)
    assert not done.marked_down and slurm.calls["mark_down"] == 0
    assert done.requeued == [101]  # the requeue stands; Slurm ends the job later


def test_fence_after_none_never_marks_down() -> None:
    slurm = _cluster(answering=False, completing_reads=300)
    done = _requeue(slurm, fence_after_s=None)
    assert not done.marked_down and slurm.calls["mark_down"] == 0


@pytest.mark.parametrize("setting", [0, 1, None])
def test_no_down_where_the_node_would_stay_down_after_its_repair(setting: int | None) -> None:
    """ReturnToService 0 or 1 (or unknown): a node set DOWN by hand stays DOWN when its
    slurmd registers again, and the runbook's wait for the repaired node would never end."""
    slurm = _cluster(answering=False, completing_reads=30)
    slurm.return_to_service_setting = setting
    done = _requeue(slurm)
    assert not done.marked_down and slurm.calls["mark_down"] == 0
    assert done.requeued == [101]  # the requeue itself stands; Slurm ends the job later


def test_no_down_after_a_controller_restart() -> None:
    """A controller that just came back shows every node not responding until its slurmd
    registers: not a sign that the node is gone."""
    slurm = _cluster(answering=False, completing_reads=30)
    original = slurm.return_to_service

    async def restarted_meanwhile() -> int | None:
        slurm.started = "2026-01-01T00:07:00"  # the controller's start moved
        return await original()

    slurm.return_to_service = restarted_meanwhile  # type: ignore[method-assign]
    done = _requeue(slurm)
    assert not done.marked_down and slurm.calls["mark_down"] == 0


def test_no_down_while_another_job_runs_on_the_node() -> None:
    """DOWN ends every job on the node: one that cannot be requeued must not end for it."""
    slurm = _cluster(answering=False, completing_reads=30)
    slurm.add_job(202, nodes="gpu-01", requeue=False)
    done = _requeue(slurm)
    assert done.not_requeueable == [202] and not done.marked_down
    assert slurm.calls["mark_down"] == 0


def test_no_down_on_a_node_someone_else_drained() -> None:
    slurm = _cluster(answering=False, completing_reads=30, reason="admin: bad DIMM")
    done = _requeue(slurm)
    assert not done.marked_down and slurm.calls["mark_down"] == 0


def test_return_to_service_is_read_from_scontrol_show_config() -> None:
    config = "BOOT_TIME               = 2026-12-05T06:00:01\nReturnToService         = 2\n"
    assert config_value(config, "ReturnToService") == "2"
    assert config_value(config, "ReturnToServiceX") == ""  # a whole key, never a prefix
    assert config_value("SlurmctldPort = 6817\n", "ReturnToService") == ""  # unknown
