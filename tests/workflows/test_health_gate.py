"""The health gate that proves the hardware (runbook v5): after a repair the node passes only
on a fresh healthy snapshot from its own agent, on top of Slurm's checks.

Time-skipping server, fake Slurm and cloud (tests/workflows/test_remediation_workflow.py's harness);
here the fake agent is off (`health.agent = False`) and the test sends the snapshots, as the
API forwards them (the `health_evidence` update):
- a fresh healthy snapshot passes the gate, and the report lists the agent's checks;
- a snapshot observed before the repair (or from the old boot) does not count: the gate
  fails at its timeout and the node stays drained;
- a fresh snapshot still showing the incident's fault fails the gate at once and the
  incident climbs to a replacement, which passes on a healthy snapshot;
- no snapshot: the gate fails after the policy's `agent_report_timeout_s`;
- `judge` itself: an Xid latched from before the repair is no evidence against the machine,
  an unhealthy InfiniBand port or a missing GPU keeps the gate waiting.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients.api.evidence import SnapshotAnswer, forward
from autoclusters.core.evidence import HealthSnapshot, judge
from autoclusters.core.models import IncidentState
from autoclusters.workflows.remediation import NodeRemediation
from tests.fakes.systems import agent_snapshot, send_evidence
from tests.workflows.test_remediation_workflow import (
    RUNBOOK,
    Fleet,
    Incident,
    _app_error,
    _fleet,
    _our_reason,
    _policy,
    _until,
)

TIMEOUT_S = 120.0


def _gate_waits(s: IncidentState) -> bool:
    return s.waiting_for is not None and s.waiting_for.kind == "agent_report"


async def _started_without_agent(f: Fleet, **policy: object) -> Incident:
    f.health.agent = False
    return await f.start(f.request(policy=_policy(agent_report_timeout_s=TIMEOUT_S, **policy)))


async def test_a_fresh_healthy_report_passes_the_gate(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        handle = await _started_without_agent(f)
        waiting = await _until(handle, _gate_waits, "the gate to wait for the agent")
        assert waiting.current_step == "health_gate"
        ack = await send_evidence(
            agent_snapshot("gpu-01", boot_id="boot-new"), client=env.client, cluster=f.cluster
        )
        assert ack.kept and ack.incident_id == waiting.request.incident_id
        result = await handle.result()

    assert result.status == "resolved"
    assert [s.name for s in result.steps] == RUNBOOK
    (report,) = result.health
    assert report.passed
    checks = {c.name: c for c in report.checks}
    assert {"gpu_faults", "agent_report", "agent_gpu_count", "infiniband"} <= set(checks)
    assert "boot boot-new" in checks["agent_report"].detail
    assert checks["agent_gpu_count"].detail == "8 of 8 GPUs seen"
    assert checks["infiniband"].detail == "8 port(s) active"
    assert not f.slurm.node_now("gpu-01").drained


async def test_a_report_older_than_the_repair_does_not_count(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        handle = await _started_without_agent(f, max_repair_attempts=1)
        await _until(handle, _gate_waits, "the gate to wait for the agent")
        old = datetime.now(UTC) - timedelta(hours=1)
        ack = await send_evidence(
            agent_snapshot("gpu-01", observed_at=old, boot_id="boot-old"),
            client=env.client,
            cluster=f.cluster,
        )
        assert ack.kept  # kept, but it says nothing about the machine that came back
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    gate = _app_error(caught.value, "HealthGateFailed")
    assert "agent_report: no agent report observed since" in gate.message
    assert f"(waited {TIMEOUT_S:.0f}s)" in gate.message
    assert state.status == "failed" and [h.passed for h in state.health] == [False]
    node = f.slurm.node_now("gpu-01")
    assert node.drained and node.reason == _our_reason(state.request)


async def test_a_report_still_showing_the_fault_fails_and_escalates(
    env: WorkflowEnvironment,
) -> None:
    async with _fleet(env) as f:
        handle = await _started_without_agent(f)
        await _until(handle, _gate_waits, "the gate after the reboot")
        await send_evidence(
            agent_snapshot("gpu-01", boot_id="boot-2", faults={"XID_79": None}),
            client=env.client,
            cluster=f.cluster,
        )
        # At once, not at the timeout: the incident is on to the replacement's gate.
        replacing = await _until(
            handle, lambda s: _gate_waits(s) and s.rung == "replace", "the replacement's gate"
        )
        await send_evidence(
            agent_snapshot("gpu-01", boot_id="boot-3"), client=env.client, cluster=f.cluster
        )
        result = await handle.result()

    first = replacing.health[0]
    assert not first.passed
    assert "gpu_faults: XID_79 still reported by the agent after the repair" in first.failures()
    # Slurm's side had passed: it is the agent that failed it.
    assert all(c.passed for c in first.checks if c.name in ("slurmd", "gpu_count"))
    assert result.status == "resolved"
    assert (result.rung, result.repair_attempts) == ("replace", 2)
    assert [h.passed for h in result.health] == [False, True]
    assert f.events() == ["opened", "escalated", "resolved"]
    assert "XID_79 still reported by the agent" in f.notes()[1].text


async def test_no_report_fails_the_gate_after_the_timeout(env: WorkflowEnvironment) -> None:
    async with _fleet(env) as f:
        handle = await _started_without_agent(f, max_repair_attempts=1)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        state = await handle.query(NodeRemediation.status)

    gate = state.step("health_gate")
    assert gate is not None and gate.outcome == "ok" and gate.finished_at is not None
    assert (gate.finished_at - gate.started_at).total_seconds() >= TIMEOUT_S
    assert gate.detail.startswith("FAILED: agent_report: no agent report observed since")
    assert state.status == "failed" and state.waiting_for is None
    assert f.slurm.node_now("gpu-01").drained
    assert f.slurm.calls["resume"] == 0


# --- judge ------------------------------------------------------------------------------------

SINCE = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
AFTER = SINCE + timedelta(seconds=30)


def test_judge_ignores_an_xid_from_before_the_repair_and_the_old_boot() -> None:
    latched = agent_snapshot(
        "gpu-01", observed_at=AFTER, boot_id="b2", faults={"XID_79": SINCE - timedelta(minutes=5)}
    )
    old_boot = agent_snapshot("gpu-01", observed_at=AFTER, boot_id="b1", faults={"XID_79": AFTER})
    j = judge(
        [old_boot, latched], since=SINCE, old_boot_id="b1", expected_gpus=8,
        incident_faults=["XID_79"],
    )  # fmt: skip
    assert j.verdict == "passed", j.checks


@pytest.mark.parametrize(
    ("snapshot", "failing"),
    [
        (agent_snapshot("gpu-01", observed_at=AFTER, ib_down=1), "infiniband"),
        (agent_snapshot("gpu-01", observed_at=AFTER, gpus=7), "agent_gpu_count"),
        (agent_snapshot("gpu-01", observed_at=AFTER, faults={"ECC_DBE": None}), "gpu_faults"),
    ],
    ids=["ib-port-down", "gpu-missing", "another-fault"],
)
def test_judge_waits_on_an_unhealthy_fresh_report(snapshot: HealthSnapshot, failing: str) -> None:
    j = judge(
        [snapshot], since=SINCE, old_boot_id=None, expected_gpus=8, incident_faults=["XID_79"]
    )
    assert j.verdict == "waiting"
    assert [c.name for c in j.checks if not c.passed] == [failing]
    # A later healthy one passes.
    later = agent_snapshot("gpu-01", observed_at=AFTER + timedelta(seconds=10))
    j = judge(
        [snapshot, later], since=SINCE, old_boot_id=None, expected_gpus=8,
        incident_faults=["XID_79"],
    )  # fmt: skip
    assert j.verdict == "passed"


SNAPSHOT_EVENTS = {
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
}


async def test_repeated_snapshots_of_a_waiting_incident_cost_no_history(
    env: WorkflowEnvironment,
) -> None:
    """Agents send every few seconds; an incident held for a human records only what
    changes: the API asks first (a query, not recorded) and forwards only news."""
    async with _fleet(env) as f:
        handle = await f.start(f.request(policy=_policy(mode="approve")))
        await _until(
            handle,
            lambda s: s.waiting_for is not None and s.waiting_for.kind == "approval",
            "the approval wait",
        )
        broken = {"XID_79": None}

        async def send(snap: HealthSnapshot) -> SnapshotAnswer:
            return await forward(env.client, f.cluster, snap)

        first = await send(agent_snapshot("gpu-01", faults=broken))
        assert first.forwarded

        async def history() -> int:
            """The events a snapshot could add: updates and signals. Not the whole history:
            the wait is shown before its "approval needed" message is sent (an activity),
            and on a loaded machine that activity and the wait's timer were recorded during
            the 20 sends (six events, CI at load 10)."""
            return len(
                [e async for e in handle.fetch_history_events() if e.event_type in SNAPSHOT_EVENTS]
            )

        before = await history()
        repeats = [await send(agent_snapshot("gpu-01", faults=broken)) for _ in range(20)]
        after = await history()
        # The update itself refuses a repeat too (a client that does not ask first).
        with pytest.raises(WorkflowUpdateFailedError, match="(?i)workflow update failed"):
            await send_evidence(
                agent_snapshot("gpu-01", faults=broken), client=env.client, cluster=f.cluster
            )
        # What changes the picture is recorded: the machine came back on another boot.
        changed = await send(agent_snapshot("gpu-01", boot_id="boot-2"))
        await handle.terminate("test done")
    assert [r.detail for r in repeats] == ["nothing new"] * 20
    assert before >= 1  # the first snapshot's update is counted
    assert after == before
    assert changed.forwarded
