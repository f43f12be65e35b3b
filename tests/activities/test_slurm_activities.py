"""Slurm activities one at a time, on the in-memory controller:

- drain respects a drain an admin already made (their reason stands);
- drain is idempotent for our own reason;
- a requeued job that already finished elsewhere does not hold the requeue step up;
- a node back on a new machine is drained again as the incident's when Slinky's operator
  took the drain over (its preStop DOWN) or undrained it; ours or an admin's stands.
"""

from __future__ import annotations

import pytest
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.job_markers import requeue_marker
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.kubernetes import SLINKY_REASON_PREFIX
from autoclusters.core.models import (
    DrainInput,
    RequeueInput,
    SlurmNode,
    WaitRegisteredInput,
    drain_reason,
)
from tests.fakes.systems import FakeSlurm


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


def _registered(state: str = "idle", flags: list[str] | None = None, reason: str = "") -> FakeSlurm:
    """gpu-01 back on a new machine (its slurmd started at 2000), as Slinky may leave it."""
    slurm = FakeSlurm()
    slurm.add_node("gpu-01", state=state, state_flags=flags, reason=reason, slurmd_start_time=2000)
    return slurm


async def _wait_registered(slurm: FakeSlurm, *, drain: bool = True) -> SlurmNode:
    inp = WaitRegisteredInput(
        node="gpu-01",
        since=1999.0,
        poll_s=0.01,
        settle_s=0,
        incident_id="INC-1" if drain else "",
        drain_reason=OURS if drain else "",
    )
    return await ActivityEnvironment().run(SlurmActivities(slurm).wait_node_registered, inp)


OURS = drain_reason("INC-1", "XID_79")


@pytest.mark.parametrize(
    ("state", "flags", "reason"),
    [
        # The old pod's preStop hook set DOWN with the operator's reason, over ours; the
        # new slurmd's registration cleared the DOWN (ReturnToService=2), not the drain.
        ("idle", ["DRAIN"], f"{SLINKY_REASON_PREFIX}Pod is terminating"),
        # The operator undrained it: the new Node joined uncordoned.
        ("idle", [], ""),
    ],
    ids=["slinky-down", "undrained"],
)
async def test_a_replaced_node_is_drained_again_as_the_incidents(
    state: str, flags: list[str], reason: str
) -> None:
    slurm = _registered(state, flags, reason)
    node = await _wait_registered(slurm)
    assert node.drained and node.reason == OURS
    assert slurm.node_now("gpu-01").reason == OURS
    assert slurm.calls["drain"] == 1


@pytest.mark.parametrize("reason", [OURS, "bad DIMM, ticket 4411"], ids=["ours", "an-admins"])
async def test_a_drain_of_ours_or_an_admins_stands_after_the_repair(reason: str) -> None:
    slurm = _registered("idle", ["DRAIN"], reason)
    node = await _wait_registered(slurm)
    assert node.reason == reason
    assert slurm.calls["drain"] == 0


async def test_without_the_incidents_drain_the_node_is_only_waited_for() -> None:
    slurm = _registered("idle", [], "")
    node = await _wait_registered(slurm, drain=False)
    assert not node.drained
    assert slurm.calls["drain"] == 0
