"""The fleet guard's side of systemic incidents (policy guard.systemic, docs/systemic.md),
on the time-skipping test server, driven with updates from the client.

Aspects covered:
- faults on `min_nodes` nodes of one leaf within the window are one systemic incident: the
  registering incident learns it from its answer, each earlier member by a signal, with the
  same incident id and workflow id;
- a fault on another leaf, or one outside the window, is no member; a later fault on the
  leaf joins the open systemic incident;
- the rack level groups by the nodes' rack, and only the fault kinds a level lists count;
- a member's repair is refused while the systemic incident is open (not queued: it yields),
  and admitted once it is closed; `close_systemic` names the members it had;
- without the policy flag the guard groups nothing (older policies behave as before).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest_asyncio
from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.core.guard import (
    AdmitRequest,
    CloseSystemic,
    GuardInput,
    IncidentOpened,
    Registration,
    guard_workflow_id,
)
from autoclusters.core.policy import GuardPolicy, NodeTopology, SystemicLevel, SystemicPolicy
from autoclusters.core.systemic_member import SYSTEMIC_MEMBER_SIGNAL, Membership
from autoclusters.workflows.fleet_guard import FleetGuard
from tests.helpers import eventually, time_skipping_env

Guard = WorkflowHandle[FleetGuard, None]

# gpu-01..04 behind leaf-01 (rack-a: 01, 02; rack-b: 03, 04), gpu-05..08 behind leaf-02.
TOPOLOGY = {
    f"gpu-{i:02d}": NodeTopology(
        leaf=f"leaf-{(i - 1) // 4 + 1:02d}", pod="pod-01", rack=f"rack-{'abcd'[(i - 1) // 2]}"
    )
    for i in range(1, 9)
}
LEAF = SystemicPolicy(enabled=True, leaf=SystemicLevel(min_nodes=3, window_s=60))


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await time_skipping_env() as environment:
        yield environment


@workflow.defn(sandboxed=False)
class Member:
    """Stands in for a member incident: keeps the guard's `systemic_member` signals."""

    def __init__(self) -> None:
        self.told: list[Membership] = []

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: False)

    @workflow.signal(name=SYSTEMIC_MEMBER_SIGNAL)
    def member(self, m: Membership) -> None:
        self.told.append(m)

    @workflow.query
    def memberships(self) -> list[Membership]:
        return self.told


@asynccontextmanager
async def _guard(
    env: WorkflowEnvironment, systemic: SystemicPolicy = LEAF
) -> AsyncIterator[tuple[Guard, str]]:
    task_queue = f"tq-{uuid.uuid4()}"
    cluster = f"test-{uuid.uuid4().hex[:8]}"
    policy = GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=10, systemic=systemic)
    async with Worker(env.client, task_queue=task_queue, workflows=[FleetGuard, Member]):
        handle = await env.client.start_workflow(
            FleetGuard.run,
            GuardInput(cluster=cluster, policy=policy, topology=TOPOLOGY),
            id=guard_workflow_id(cluster),
            task_queue=task_queue,
        )
        try:
            yield handle, task_queue
        finally:
            await handle.terminate("test over")  # the stand-ins end with the test's server


async def _open(
    env: WorkflowEnvironment, g: Guard, task_queue: str, node: str, fault: str = "IB_LINK_DOWN"
) -> tuple[Registration, str, str]:
    """A stand-in member incident registers; its answer, incident id and workflow id."""
    wf_id = f"member-{node}-{uuid.uuid4().hex[:6]}"
    await env.client.start_workflow(Member.run, id=wf_id, task_queue=task_queue)
    incident_id = f"INC-{node}-{uuid.uuid4().hex[:6]}"
    reg = await g.execute_update(
        FleetGuard.register,
        IncidentOpened(node=node, incident_id=incident_id, fault=fault, workflow_id=wf_id),
    )
    return reg, incident_id, wf_id


async def _told(env: WorkflowEnvironment, wf_id: str) -> Membership:
    handle = env.client.get_workflow_handle_for(Member.run, wf_id)

    async def first() -> Membership | None:
        got = await handle.query(Member.memberships)
        return got[0] if got else None

    return await eventually(first, what=f"the systemic signal to {wf_id}")


async def _memberships(env: WorkflowEnvironment, wf_id: str) -> list[Membership]:
    return await env.client.get_workflow_handle_for(Member.run, wf_id).query(Member.memberships)


async def test_three_faults_on_one_leaf_are_one_systemic_incident(
    env: WorkflowEnvironment,
) -> None:
    async with _guard(env) as (g, tq):
        first, _, wf1 = await _open(env, g, tq, "gpu-01")
        other_leaf, _, wf5 = await _open(env, g, tq, "gpu-05")
        second, _, wf2 = await _open(env, g, tq, "gpu-02")
        assert first.systemic is None and second.systemic is None and other_leaf.systemic is None

        third, _, _ = await _open(env, g, tq, "gpu-03")
        m = third.systemic
        assert m is not None and (m.level, m.domain) == ("leaf", "leaf-01")
        assert m.nodes == ["gpu-01", "gpu-02", "gpu-03"]
        assert m.incident_id.startswith("inc-") and m.incident_id.endswith("-leaf-01")
        # The earlier members are told, by a signal, of the same incident.
        for wf in (wf1, wf2):
            told = await _told(env, wf)
            assert (told.incident_id, told.workflow_id) == (m.incident_id, m.workflow_id)
        assert await _memberships(env, wf5) == []  # the other leaf's node is no member

        # A fourth fault on the leaf joins the open incident; the other leaf stays out.
        fourth, _, _ = await _open(env, g, tq, "gpu-04")
        assert fourth.systemic is not None and fourth.systemic.incident_id == m.incident_id
        assert fourth.systemic.nodes == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
        status = await g.query(FleetGuard.status)
        [group] = status.state.systemic
        assert sorted(group.members) == ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


async def test_faults_outside_the_window_or_not_listed_make_none(
    env: WorkflowEnvironment,
) -> None:
    listed = SystemicPolicy(
        enabled=True, leaf=SystemicLevel(min_nodes=3, window_s=60, faults=["IB_LINK_DOWN"])
    )
    async with _guard(env, listed) as (g, tq):
        await _open(env, g, tq, "gpu-01")
        await env.sleep(61)  # the first falls out of the window
        await _open(env, g, tq, "gpu-02")
        late, _, _ = await _open(env, g, tq, "gpu-03")
        assert late.systemic is None
        gpu, _, _ = await _open(env, g, tq, "gpu-04", fault="XID_79")  # not a fabric fault
        assert gpu.systemic is None
        third, _, _ = await _open(env, g, tq, "gpu-01")  # within the window again
        assert third.systemic is not None
        assert third.systemic.nodes == ["gpu-01", "gpu-02", "gpu-03"]


async def test_the_rack_level_groups_by_rack(env: WorkflowEnvironment) -> None:
    racks = SystemicPolicy(enabled=True, leaf=None, rack=SystemicLevel(min_nodes=2, window_s=60))
    async with _guard(env, racks) as (g, tq):
        a, _, _ = await _open(env, g, tq, "gpu-02", fault="NODE_NOT_READY")
        b, _, _ = await _open(env, g, tq, "gpu-03", fault="NODE_NOT_READY")  # rack-b
        assert a.systemic is None and b.systemic is None
        c, _, _ = await _open(env, g, tq, "gpu-01", fault="NODE_NOT_READY")  # rack-a
        assert c.systemic is not None and (c.systemic.level, c.systemic.domain) == (
            "rack",
            "rack-a",
        )
        assert c.systemic.nodes == ["gpu-01", "gpu-02"]


async def test_a_members_repair_waits_for_the_systemic_incident(
    env: WorkflowEnvironment,
) -> None:
    async with _guard(env) as (g, tq):
        opened = [await _open(env, g, tq, f"gpu-0{i}") for i in (1, 2, 3)]
        m = opened[-1][0].systemic
        assert m is not None
        _, incident_id, wf_id = opened[0]
        ask = AdmitRequest(
            node="gpu-01", incident_id=incident_id, cluster_nodes=8, workflow_id=wf_id
        )
        refused = await g.execute_update(FleetGuard.admit_repair, ask)
        assert not refused.admitted and not refused.queued
        assert refused.systemic is not None and refused.systemic.incident_id == m.incident_id
        assert "systemic incident" in refused.reason
        # A node of the other leaf is repaired as before.
        other, other_id, _ = await _open(env, g, tq, "gpu-06", fault="XID_79")
        assert other.systemic is None
        admitted = await g.execute_update(
            FleetGuard.admit_repair,
            AdmitRequest(node="gpu-06", incident_id=other_id, cluster_nodes=8),
        )
        assert admitted.admitted

        members = await g.execute_update(
            FleetGuard.close_systemic, CloseSystemic(incident_id=m.incident_id)
        )
        assert members == ["gpu-01", "gpu-02", "gpu-03"]
        assert (await g.execute_update(FleetGuard.admit_repair, ask)).admitted


async def test_without_the_policy_flag_nothing_is_grouped(env: WorkflowEnvironment) -> None:
    async with _guard(env, SystemicPolicy()) as (g, tq):
        regs = [(await _open(env, g, tq, f"gpu-0{i}"))[0] for i in (1, 2, 3, 4)]
        assert all(r.systemic is None for r in regs)
        assert (await g.query(FleetGuard.status)).state.systemic == []
