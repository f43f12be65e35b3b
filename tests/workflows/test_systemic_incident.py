"""Systemic incidents (policy guard.systemic, docs/systemic.md) on the time-skipping test
server: a fake cluster of 8 nodes behind two InfiniBand leaves, the real NodeRemediation,
FleetGuard and SystemicIncident, the sandbox's ticket desk on loopback as the provider, and
a fake burn-in screen.

Aspects covered:
- IB_LINK_DOWN on four nodes of one leaf: one systemic incident that owns them; each is
  drained (within the floor), none is rebooted or replaced, one Slack thread with the
  evidence, one hand-off (one ticket, the leaf and its members); `fixed` screens them
  together and each member returns its node, unrepaired; the other leaf's job is untouched;
- the floor holds: members it cannot drain wait for it; told `fixed`, each screens itself
  once drained and returns, and no more nodes are ever out than the floor allows;
- a member that fails the screen (together, then alone) gets its own incident: its ladder,
  screened again after its repair; the others return;
- `declined`: every member stays drained, closed `handed_off`;
- a member whose reboot had already started when the leaf went systemic (its incident
  opened before the topology was known): the reboot runs to its end, then the member yields
  (no gate, no next rung) and is screened with the others;
- a lone fault of a kind the leaf counts waits out the window before its own repair, then
  climbs its ladder as before;
- a systemic incident cancelled (the Temporal UI) tells its members: none waits for ever,
  each is left drained for a human;
- on Slurm on Kubernetes the members' Nodes are uncordoned (taint kept) for the screen
  together, as a node's own screen does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest_asyncio
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from autoclusters.activities.screen import reservation_name
from autoclusters.core.handoff_answer import HandoffAnswer
from autoclusters.core.models import IncidentState, ScreenInput, ScreenResult
from autoclusters.core.policy import (
    BurnInScreen,
    FaultRule,
    GuardPolicy,
    NodeTopology,
    Policy,
    Rung,
    SystemicLevel,
    SystemicPolicy,
)
from autoclusters.core.systemic import SystemicState, systemic_workflow_id
from autoclusters.workers.remediation import WORKFLOWS
from autoclusters.workflows.systemic_incident import SystemicIncident
from tests.fakes.systems import FakeCloud
from tests.helpers import run_state, time_skipping_env
from tests.histories.record import FakeKubernetes
from tests.workflows.test_handoff_workflow import Desked, _desked
from tests.workflows.test_remediation_workflow import FAULTS, Incident, _policy, _until, _waiting

LEAF_01 = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]
TOPOLOGY = {
    f"gpu-{i:02d}": NodeTopology(leaf=f"leaf-{(i - 1) // 4 + 1:02d}", pod="pod-01")
    for i in range(1, 9)
}
Systemic = WorkflowHandle[SystemicIncident, SystemicState]
REPLAYER = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await time_skipping_env() as environment:
        yield environment


class Screens:
    """A burn-in screen: a node in `fails` fails it until it has had a repair of its own."""

    def __init__(self, cloud: FakeCloud, fails: set[str] | None = None) -> None:
        self.cloud = cloud
        self.fails = fails or set()
        self.calls: list[ScreenInput] = []

    def activity(self) -> Callable[..., Any]:
        @activity.defn(name="burn_in_screen")
        async def burn_in_screen(inp: ScreenInput) -> ScreenResult:
            self.calls.append(inp)
            nodes = [inp.node, *inp.others]
            repaired = {n for n, _, _ in self.cloud.repair_calls}
            bad = {n for n in nodes if n in self.fails and n not in repaired}
            diag = {n: "IB port down" if n in bad else "pass" for n in nodes}
            return ScreenResult(
                node=inp.node, passed=not bad, seconds=3.0,
                reservation=reservation_name(inp.node), job_id=50 + len(self.calls),
                allreduce_s=0.01, busbw_gbps=9.5, backend="gloo", diag=diag,
                detail="passed" if not bad else f"diagnostic on {', '.join(sorted(bad))}",
            )  # fmt: skip

        return burn_in_screen


def _leaf_policy(f: Desked, *, fraction: float = 0.5, **changes: Any) -> Policy:
    return _policy(
        faults={**FAULTS, "IB_LINK_DOWN": FaultRule(severity="critical", first_rung=Rung.REBOOT)},
        guard=GuardPolicy(
            min_in_service_fraction=fraction,
            breaker_threshold=10,
            systemic=SystemicPolicy(
                enabled=True, leaf=SystemicLevel(min_nodes=3, window_s=60), settle_s=30
            ),
        ),
        topology=TOPOLOGY,
        handoff=f.handoff_policy(),
        burn_in=BurnInScreen(timeout_s=120),
        **changes,
    )


@asynccontextmanager
async def _leaf(
    env: WorkflowEnvironment,
    *,
    fails: set[str] | None = None,
    hold: bool = False,
    extra: list[Callable[..., Any]] | None = None,
) -> AsyncIterator[tuple[Desked, Screens]]:
    """8 nodes, two leaves (job 105 on the other leaf), the desk, a worker."""
    async with _desked(env, fixed_by=Rung.REBOOT) as f:
        for i in range(4, 9):
            f.slurm.add_node(f"gpu-{i:02d}")
        f.slurm.add_job(105, nodes="gpu-[05-06]")
        f.cloud.hold = hold
        screens = Screens(f.cloud, fails)
        f.extra = [screens.activity(), *(extra or [])]
        f.started.append(systemic_workflow_id(f.cluster, "leaf", "leaf-01"))
        async with f.worker():
            yield f, screens


async def _open(
    f: Desked, nodes: list[str], policy: Policy, *, kubernetes: bool = False
) -> list[Incident]:
    reqs = [f.request(n, "IB_LINK_DOWN", policy=policy) for n in nodes]
    reqs = [r.model_copy(update={"kubernetes": kubernetes}) for r in reqs]
    return list(await asyncio.gather(*(f.start(r) for r in reqs)))


def _systemic(f: Desked) -> Systemic:
    return f.env.client.get_workflow_handle_for(
        SystemicIncident.run, systemic_workflow_id(f.cluster, "leaf", "leaf-01")
    )


async def _systemic_until(
    f: Desked, check: Callable[[SystemicState], bool], what: str, timeout_s: float = 60
) -> SystemicState:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            state = await run_state(_systemic(f), SystemicIncident.status)
            if check(state):
                return state
        except Exception:  # noqa: BLE001 - not started yet: ask again
            state = None
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {state}")
        await asyncio.sleep(0.1)


def _handed_off(s: SystemicState) -> bool:
    w, h = s.waiting_for, s.handoff
    return w is not None and w.kind == "handoff" and h is not None and h.sent_at is not None


async def _answer(f: Desked, answer: str) -> None:
    rec = await _systemic(f).execute_update(
        SystemicIncident.handoff_answer, HandoffAnswer(answer=answer, note="leaf switch swapped")
    )
    assert rec.answer == answer


async def _results(handles: list[Incident]) -> list[IncidentState]:
    """The members' ends, polled in real time: a result awaited lets the test server skip
    time, and between two tasks it can see nothing but the runs' day-long timeouts."""
    return [await _until(h, lambda s: s.status != "open", "the member's end") for h in handles]


async def _ended(f: Desked) -> SystemicState:
    return await _systemic_until(f, lambda s: s.status != "open", "the systemic incident's end")


async def test_four_nodes_of_one_leaf_are_one_systemic_incident(env: WorkflowEnvironment) -> None:
    async with _leaf(env) as (f, screens):
        handles = await _open(f, LEAF_01, _leaf_policy(f))
        state = await _systemic_until(f, _handed_off, "the hand-off")
        # Every member drained and parked; the floor (4 of 8) is never crossed.
        for h in handles:
            await _until(h, _waiting("systemic"), "the member to park")
        assert all(f.slurm.node_now(n).drained for n in LEAF_01)
        guard = await f.guard_status()
        assert sorted(guard.state.out_of_service) == LEAF_01
        assert f.cloud.repair_calls == [], "no machine rebooted or replaced"
        assert sorted(m.node for m in state.members) == LEAF_01
        assert all(m.drained for m in state.members)
        # One hand-off: one ticket naming the leaf and its members.
        [ticket] = f.tickets()
        assert ticket.key == state.request.incident_id
        assert ticket.request["node"] == "leaf-01" and ticket.request["level"] == "leaf"
        assert ticket.request["members"] == LEAF_01
        assert ticket.request["reason"] == "provider_fault"

        await _answer(f, "fixed")
        results = await _results(handles)
        final = await _ended(f)

    assert [r.status for r in results] == ["resolved"] * 4
    assert all(r.repair_attempts == 0 for r in results)
    assert all(r.systemic_verdict and r.systemic_verdict.verdict == "returned" for r in results)
    assert not any(f.slurm.node_now(n).drained for n in LEAF_01)
    assert f.cloud.repair_calls == []
    # Screened together: one screen of the four.
    [together] = screens.calls
    assert sorted([together.node, *together.others]) == LEAF_01 and not together.neighbour
    assert final.status == "resolved" and [m.verdict for m in final.members] == ["returned"] * 4
    # One Slack thread for the systemic incident, with the evidence.
    thread = [n for n in f.notifier.notes if n.incident_id == final.request.incident_id]
    events = [n.event for n in thread]
    assert events[:2] == ["opened", "evidence"] and events[-1] == "resolved"
    evidence = next(n.text for n in thread if n.event == "evidence")
    assert all(n in evidence for n in LEAF_01) and "IB_LINK_DOWN" in evidence
    # The other leaf's job is untouched.
    other = f.slurm.job_now(105)
    assert other.job_state == "RUNNING" and other.restart_cnt == 0


async def test_the_floor_holds_and_late_members_screen_themselves(
    env: WorkflowEnvironment,
) -> None:
    async with _leaf(env) as (f, screens):
        handles = await _open(f, LEAF_01, _leaf_policy(f, fraction=0.75))
        state = await _systemic_until(f, _handed_off, "the hand-off")
        drained = [m.node for m in state.members if m.drained]
        assert len(drained) == 2, "the floor: 6 of 8 stay in service"
        assert sum(f.slurm.node_now(n).drained for n in LEAF_01) == 2
        assert f.cloud.repair_calls == []

        await _answer(f, "fixed")
        results = await _results(handles)
        final = await _ended(f)

    assert [r.status for r in results] == ["resolved"] * 4
    assert all(r.repair_attempts == 0 for r in results)
    verdicts = {r.request.node: r.systemic_verdict.verdict for r in results if r.systemic_verdict}
    assert sorted(n for n, v in verdicts.items() if v == "returned") == sorted(drained)
    late = sorted(n for n, v in verdicts.items() if v == "fixed")
    assert len(late) == 2
    # Together the two drained; each late member alone, once the floor let it drain.
    assert sorted([screens.calls[0].node, *screens.calls[0].others]) == sorted(drained)
    assert sorted(c.node for c in screens.calls[1:]) == late
    assert all(not c.others for c in screens.calls[1:])
    assert final.status == "resolved"
    assert not any(f.slurm.node_now(n).drained for n in LEAF_01)


async def test_a_member_that_fails_its_screen_gets_its_own_incident(
    env: WorkflowEnvironment,
) -> None:
    async with _leaf(env, fails={"gpu-03"}) as (f, screens):
        handles = await _open(f, LEAF_01, _leaf_policy(f))
        await _systemic_until(f, _handed_off, "the hand-off")
        await _answer(f, "fixed")
        results = {r.request.node: r for r in await _results(handles)}
        final = await _ended(f)

    bad = results["gpu-03"]
    assert bad.status == "resolved" and bad.repair_attempts == 1
    assert bad.systemic_verdict is not None and bad.systemic_verdict.verdict == "screen_failed"
    assert [(n, r) for n, r, _ in f.cloud.repair_calls] == [("gpu-03", Rung.REBOOT)]
    assert "escalated" in f.events("gpu-03")
    for node in ("gpu-01", "gpu-02", "gpu-04"):
        assert results[node].repair_attempts == 0 and results[node].status == "resolved"
    # Together (failed), each alone, then gpu-03 again after its own reboot.
    assert len(screens.calls[0].others) == 3
    assert sorted(c.node for c in screens.calls[1:5]) == LEAF_01
    assert screens.calls[-1].node == "gpu-03" and screens.calls[-1].key.endswith(":1")
    assert {m.node: m.verdict for m in final.members}["gpu-03"] == "screen_failed"


async def test_declined_leaves_every_member_drained(env: WorkflowEnvironment) -> None:
    async with _leaf(env) as (f, screens):
        handles = await _open(f, LEAF_01, _leaf_policy(f))
        await _systemic_until(f, _handed_off, "the hand-off")
        await _answer(f, "declined")
        results = await _results(handles)
        final = await _ended(f)
        guard = await f.guard_status()

    assert [r.status for r in results] == ["handed_off"] * 4
    assert all(f.slurm.node_now(n).drained for n in LEAF_01)
    assert f.cloud.repair_calls == [] and screens.calls == []
    assert final.status == "handed_off"
    assert guard.state.systemic == []


async def test_a_reboot_already_running_ends_and_the_member_yields(
    env: WorkflowEnvironment,
) -> None:
    async with _leaf(env, hold=True) as (f, screens):
        policy = _leaf_policy(f)
        # gpu-01's incident opened before the topology was known (its snapshot has none): it
        # does not wait for a window and reboots; the later ones bring the topology, and
        # the guard, adopting it, counts gpu-01 in.
        [first] = await _open(f, ["gpu-01"], policy.model_copy(update={"topology": {}}))
        await asyncio.wait_for(f.cloud.started.wait(), 30)  # its reboot is in flight
        others = await _open(f, ["gpu-02", "gpu-03"], policy)
        await _until(first, lambda s: s.systemic is not None, "gpu-01 to be told")
        f.cloud.release.set()  # the reboot ends; gpu-01 yields after it
        state = await _systemic_until(f, _handed_off, "the hand-off")
        joined = {m.node: m for m in state.members}
        assert joined["gpu-01"].repaired == "reboot"
        await _answer(f, "fixed")
        results = await _results([first, *others])
        # Each member's run replays on the current code: a query once failed on it (ci18).
        for h in [first, *others]:
            history = await h.fetch_history()
            replayed = await REPLAYER.replay_workflow(history, raise_on_replay_failure=False)
            assert replayed.replay_failure is None, (h.id, replayed.replay_failure)

    gpu01 = results[0]
    assert gpu01.status == "resolved" and gpu01.repair_attempts == 1
    assert [s.name for s in gpu01.steps].count("repair") == 1
    assert "health_gate" not in [s.name for s in gpu01.steps], "no gate, no next rung"
    assert [(n, r) for n, r, _ in f.cloud.repair_calls] == [("gpu-01", Rung.REBOOT)]
    assert all(r.repair_attempts == 0 and r.status == "resolved" for r in results[1:])
    [together] = screens.calls
    assert sorted([together.node, *together.others]) == ["gpu-01", "gpu-02", "gpu-03"]


async def test_a_lone_fault_waits_out_the_window_then_is_its_own(env: WorkflowEnvironment) -> None:
    async with _leaf(env) as (f, screens):
        [alone] = await _open(f, ["gpu-02"], _leaf_policy(f))
        await _until(alone, lambda s: s.current_step == "systemic_window", "the window")
        assert f.cloud.repair_calls == []
        await env.sleep(61)  # no other fault on the leaf within it
        result = await _until(alone, lambda s: s.status != "open", "the lone incident's end")

    names = [s.name for s in result.steps]
    assert names.index("wait_idle") < names.index("systemic_window") < names.index("repair")
    assert "no systemic incident within 60s" in (result.step("systemic_window").detail or "")
    assert result.status == "resolved" and result.systemic is None
    assert [(n, r) for n, r, _ in f.cloud.repair_calls] == [("gpu-02", Rung.REBOOT)]
    assert f.tickets() == [] and screens.calls == []


async def test_a_cancelled_systemic_incident_leaves_its_members_drained_for_a_human(
    env: WorkflowEnvironment,
) -> None:
    async with _leaf(env) as (f, _screens):
        handles = await _open(f, LEAF_01[:3], _leaf_policy(f))
        await _systemic_until(f, _handed_off, "the hand-off")
        await _systemic(f).cancel()
        results = await _results(handles)
        final = await _ended(f)
        guard = await f.guard_status()

    assert final.status == "cancelled"
    assert [r.status for r in results] == ["failed"] * 3, "none waits for ever"
    assert all(r.systemic_verdict and r.systemic_verdict.verdict == "failed" for r in results)
    assert all(f.slurm.node_now(n).drained for n in LEAF_01[:3])
    assert f.cloud.repair_calls == [] and guard.state.systemic == []


async def test_on_kubernetes_the_members_nodes_are_uncordoned_for_the_screen(
    env: WorkflowEnvironment,
) -> None:
    k8s = FakeKubernetes()
    async with _leaf(env, extra=k8s.activities()) as (f, screens):
        handles = await _open(f, LEAF_01[:3], _leaf_policy(f), kubernetes=True)
        await _systemic_until(f, _handed_off, "the hand-off")
        assert k8s.calls.count("cordon quarantine") == 3
        await _answer(f, "fixed")
        results = await _results(handles)
        final = await _ended(f)

    assert [r.status for r in results] == ["resolved"] * 3
    names = [s.name for s in final.steps]
    assert names.count("k8s_uncordon") == 3
    assert names.index("k8s_uncordon") < names.index("burn_in_screen")
    assert "k8s_cordon" not in names  # the screen passed: the members give their Nodes back
    [together] = screens.calls
    assert len(together.others) == 2 and f.cloud.repair_calls == []
