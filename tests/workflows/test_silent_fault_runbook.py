"""The runbook's own path for a silent fault (issue 40): screen before repair.

Aspects:
- a JOB_HANG whose rule says `screen_before_repair`: the node's jobs recovered first (drain,
  requeue, idle), then the screen; passed, the node goes back with no repair at all, and
  the close says so; the screen's key is attempt 0;
- a SLOW_NODE: the jobs checkpoint first; a failed screen climbs the ladder from the
  rule's first rung, and that repair is screened again although `burn_in` is off;
- a rule without the flag repairs at once, as before (the path only a new rule takes); a
  fault no screen clears, reported during the screen, has the node repaired anyway;
- observe mode's plan names the screen;
- the opening message (and so the Slack card) says why the agent named the node;
- the lemon record counts an incident screened before repair, and the history reader
  (clients/incident_history.py) tells one, and its screen's verdict, from the recorded
  history; a policy replay takes that verdict where the candidate screens first too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients.incident_history import record_from_history
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.incident_record import IncidentRecord
from autoclusters.core.lemon import repairs_on_node
from autoclusters.core.models import FaultReport, ScreenInput, ScreenResult
from autoclusters.core.policy import FaultRule, Rung
from autoclusters.core.policy_replay import replay_policy
from autoclusters.workflows.burn_in_steps import screen_text
from autoclusters.workflows.remediation import NodeRemediation
from tests.workflows.test_remediation_workflow import FAULTS, _fleet, _policy, env  # noqa: F401

HISTORIES = Path(__file__).parents[1] / "histories"
SILENT = {
    **FAULTS,
    "JOB_HANG": FaultRule(
        severity="critical", first_rung=Rung.RESET_GPU, screen_before_repair=True
    ),
    "SLOW_NODE": FaultRule(
        severity="warning",
        first_rung=Rung.RESET_GPU,
        on_degraded="checkpoint_then_drain",
        screen_before_repair=True,
    ),
}


def _screen(verdicts: list[bool]) -> tuple[Callable[..., object], list[ScreenInput]]:
    """A screen that answers `verdicts` in turn (the last one for ever after)."""
    calls: list[ScreenInput] = []

    @activity.defn(name="burn_in_screen")
    async def burn_in_screen(inp: ScreenInput) -> ScreenResult:
        calls.append(inp)
        ok = verdicts[min(len(calls), len(verdicts)) - 1]
        return ScreenResult(
            node=inp.node, passed=ok, seconds=9.0, job_id=60 + len(calls), neighbour="gpu-03",
            allreduce_s=0.004, busbw_gbps=16.7, gemm_tflops={inp.node: 310.0 if ok else 92.5},
            detail="passed" if ok else f"GEMM on {inp.node} 92.5 TFLOP/s < 250",
        )  # fmt: skip

    return burn_in_screen, calls


async def test_a_hung_node_that_passes_its_screen_goes_back_unrepaired(
    env: WorkflowEnvironment,  # noqa: F811
) -> None:
    screen, calls = _screen([True])
    async with _fleet(env, extra_activities=[screen]) as f:
        req = f.request(fault="JOB_HANG", policy=_policy(faults=SILENT))
        result = await (await f.start(req)).result()

    assert result.status == "resolved" and not f.slurm.node_now("gpu-01").drained
    assert f.cloud.repair_calls == [] and result.repair_attempts == 0
    names = [s.name for s in result.steps]
    # The job first: drained, requeued (in-job where it can), idle; then the screen.
    assert names.index("requeue") < names.index("wait_idle") < names.index("burn_in_screen")
    assert names.index("burn_in_screen") < names.index("return_to_service")
    assert "repair" not in names and "health_gate" not in names
    assert [c.key for c in calls] == [f"{req.incident_id}:0"]
    assert result.requeued_jobs == [101] and [s.passed for s in result.screens] == [True]
    closing = [n for n in f.notes() if n.event == "resolved"]
    assert closing and "without a repair (passed its screen)" in closing[0].text


async def test_a_slow_node_that_fails_its_screen_is_repaired_and_screened_again(
    env: WorkflowEnvironment,  # noqa: F811
) -> None:
    screen, calls = _screen([False, True])
    async with _fleet(env, extra_activities=[screen]) as f:
        f.slurm.checkpointing.add(101)
        req = f.request(fault="SLOW_NODE", policy=_policy(faults=SILENT))
        result = await (await f.start(req)).result()

    assert result.status == "resolved" and result.rung == Rung.RESET_GPU.value
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.RESET_GPU]
    assert [s.passed for s in result.screens] == [False, True]
    assert [c.key for c in calls] == [f"{req.incident_id}:0", f"{req.incident_id}:1"]
    names = [s.name for s in result.steps]
    assert names.index("checkpoint") < names.index("burn_in_screen") < names.index("repair")
    assert result.health[-1].checks[-1].name == "burn_in_screen"  # burn_in is off: still
    escalated = [n for n in f.notes() if n.event == "escalated"]
    assert escalated and "failed its screen after SLOW_NODE" in escalated[0].text
    assert "92.5 TFLOP/s" in escalated[0].text and "next: reset_gpu" in escalated[0].text


async def test_without_the_rule_a_hang_is_repaired_at_once(
    env: WorkflowEnvironment,  # noqa: F811
) -> None:
    screen, calls = _screen([True])
    plain = {**FAULTS, "JOB_HANG": FaultRule(severity="critical", first_rung=Rung.RESET_GPU)}
    async with _fleet(env, extra_activities=[screen]) as f:
        result = await (
            await f.start(f.request(fault="JOB_HANG", policy=_policy(faults=plain)))
        ).result()

    assert result.status == "resolved" and calls == [] and result.screens == []
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.RESET_GPU]


async def test_observe_mode_plans_the_screen(env: WorkflowEnvironment) -> None:  # noqa: F811
    async with _fleet(env) as f:
        policy = _policy(faults=SILENT, mode="observe")
        result = await (await f.start(f.request(fault="JOB_HANG", policy=policy))).result()
    assert any("screen of gpu-01 before any repair" in p for p in result.planned_steps)


def test_the_lemon_record_counts_a_node_screened_back() -> None:
    at = datetime(2026, 12, 1, tzinfo=UTC)

    def rec(i: int, **kw: object) -> IncidentRecord:
        return IncidentRecord(
            incident_id=f"inc-{i}", cluster="c", node="gpu-01", fault="JOB_HANG",
            started_at=at + timedelta(hours=i), **kw,
        )  # fmt: skip

    records = [rec(1, screened_before_repair=True), rec(2), rec(3, screened_before_repair=True)]
    assert repairs_on_node(records, "gpu-01", at) == 2


def _history(case: str) -> IncidentRecord:
    path = HISTORIES / f"remediation_0.2_{case}.json"
    return record_from_history(WorkflowHistory.from_json(case, path.read_text()))


def test_the_history_of_a_screened_hang_says_so() -> None:
    back, repaired = _history("screened_back"), _history("screened_then_repaired")
    assert back.screened_before_repair and back.screen_passed and back.repairs == []
    assert back.status == "resolved" and back.fault == "JOB_HANG"
    assert repaired.screened_before_repair and repaired.screen_passed is False
    assert [(a.rung, a.passed) for a in repaired.repairs] == [(Rung.RESET_GPU, True)]


def test_a_policy_replay_knows_the_screen_before_repair() -> None:
    """Replayed under their own policy, the screened incidents change nothing; without the
    screen the hang would have been repaired (a rung it never tried: unknown); an incident
    that was never screened first cannot tell what a screen would have said."""
    back, repaired = _history("screened_back"), _history("screened_then_repaired")
    same = replay_policy(back.policy, [back, repaired])
    assert [d.changes for d in same.incidents] == [[], []]
    plain = back.policy.model_copy(
        update={"faults": {**back.policy.faults, "JOB_HANG": FaultRule(
            severity="critical", first_rung=Rung.RESET_GPU)}}
    )  # fmt: skip
    [d] = replay_policy(plain, [back]).incidents
    assert d.candidate.repairs == ["reset_gpu"] and d.candidate.outcome == "unknown"
    unscreened = back.model_copy(update={"screened_before_repair": False, "screen_passed": None})
    [u] = replay_policy(back.policy, [unscreened]).incidents
    assert u.candidate.outcome == "unknown" and "screen before repair" in u.notes[0]


def test_the_screen_text_names_the_gemm_rates() -> None:
    res = ScreenResult(
        node="gpu-01", passed=False, seconds=3.0, job_id=7, gemm_tflops={"gpu-01": 92.5},
        detail="GEMM on gpu-01 92.5 TFLOP/s < 250",
    )  # fmt: skip
    assert screen_text(res).endswith("GEMM gpu-01 92.5 TFLOP/s")
    assert screen_text(res).startswith("FAILED: GEMM on gpu-01")


async def test_the_opening_message_says_why_that_node(
    env: WorkflowEnvironment,  # noqa: F811
) -> None:
    """The agent's evidence (the rule, its figures, the stack groups) reaches the opening
    notification, which the Slack card shows (tests/core/test_why_named.py renders it)."""
    screen, _calls = _screen([True])
    subject = {
        "job": "4242", "rank": 3, "node": "gpu-01", "rule": "heartbeat", "stalled_s": 40.0,
        "threshold_s": 25.0, "pid": 5123, "in_collective": False, "heartbeat_age_s": 40.0,
        "stacks": {"tool": "py-spy", "detail": "py-spy is not installed on this node: no stacks"},
    }  # fmt: skip
    async with _fleet(env, extra_activities=[screen]) as f:
        req = f.request(fault="JOB_HANG", policy=_policy(faults=SILENT))
        req.opening = FaultReport(
            incident_id=req.incident_id, fault="JOB_HANG", source="agent", at=req.opened_at,
            evidence=FaultEvidence.from_agent(
                key="agent-1", since=req.opened_at, readings={"subjects": [subject]},
                message="job 4242 made no step for 40s (threshold 25s): rank 3 on gpu-01",
            ),
        )  # fmt: skip
        await (await f.start(req)).result()
    [opened] = [n for n in f.notes() if n.event == "opened"]
    assert "rank 3 on gpu-01" in opened.text
    assert "Why this node: job 4242 rank 3 (pid 5123), rule heartbeat" in opened.text
    assert "Stacks: py-spy is not installed on this node" in opened.text


async def test_a_fault_no_screen_clears_repairs_a_node_that_passed(
    env: WorkflowEnvironment,  # noqa: F811
) -> None:
    """An XID_79 reported while the hung job's node is screened: the screen passes, but the
    node is repaired (the Xid's rung), never returned on the screen's word."""
    screening, go_on = asyncio.Event(), asyncio.Event()

    @activity.defn(name="burn_in_screen")
    async def burn_in_screen(inp: ScreenInput) -> ScreenResult:
        screening.set()
        await go_on.wait()
        return ScreenResult(node=inp.node, passed=True, seconds=1.0, detail="passed")

    async with _fleet(env, extra_activities=[burn_in_screen]) as f:
        req = f.request(fault="JOB_HANG", policy=_policy(faults=SILENT))
        handle = await f.start(req)
        await asyncio.wait_for(screening.wait(), timeout=30)
        xid = FaultReport(incident_id=req.incident_id, fault="XID_79", source="dcgm",
                          at=req.opened_at)  # fmt: skip
        await handle.execute_update(NodeRemediation.report_fault, xid)
        go_on.set()
        result = await handle.result()

    assert result.status == "resolved" and result.rung == Rung.REBOOT.value
    assert [r for _, r, _ in f.cloud.repair_calls] == [Rung.REBOOT]
    escalated = [n for n in f.notes() if n.event == "escalated"]
    assert escalated and "passed its screen, but the incident now has JOB_HANG, XID_79" in (
        escalated[0].text
    )
