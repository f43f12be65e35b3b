"""Slurm activities one at a time, on the in-memory controller:

- drain respects a drain an admin already made (their reason stands);
- drain is idempotent for our own reason;
- a requeued job that already finished elsewhere does not hold the requeue step up.
"""

from __future__ import annotations

from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities, requeue_marker
from autoclusters.core.models import DrainInput, RequeueInput, drain_reason
from tests.fakes import FakeSlurm


async def test_drain_keeps_an_admins_drain() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason="bad DIMM, ticket 4411")
    res = await ActivityEnvironment().run(
        SlurmActivities(slurm).drain_node,
        DrainInput(node="gpu-01", reason=drain_reason("INC-1", "XID_79")),
    )
    assert res.already_drained and res.previous_reason == "bad DIMM, ticket 4411"
    assert slurm.node_now("gpu-01").reason == "bad DIMM, ticket 4411"
    assert slurm.calls["drain"] == 0


async def test_drain_twice_drains_once() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01")
    acts, env = SlurmActivities(slurm), ActivityEnvironment()
    inp = DrainInput(node="gpu-01", reason=drain_reason("INC-1", "XID_79"))
    first = await env.run(acts.drain_node, inp)
    second = await env.run(acts.drain_node, inp)
    assert not first.already_drained and second.already_drained
    assert slurm.calls["drain"] == 1


async def test_requeued_job_that_already_finished_does_not_block() -> None:
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state_flags=["DRAIN"], reason=drain_reason("INC-1", "XID_79"))
    slurm.add_node("gpu-02")
    # An earlier attempt requeued job 7; it restarted elsewhere and has completed since.
    slurm.add_job(
        7, nodes="gpu-02", job_state="COMPLETED", restart_cnt=1,
        admin_comment=requeue_marker("INC-1", 0),
    )  # fmt: skip
    res = await ActivityEnvironment().run(
        SlurmActivities(slurm).requeue_jobs, RequeueInput(node="gpu-01", incident_id="INC-1")
    )
    assert res.requeued == [7] and res.holds_released == []
    assert slurm.requeue_count[7] == 0
