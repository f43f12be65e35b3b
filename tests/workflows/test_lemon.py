"""Lemon nodes (issue 23, item 5): a node repaired `lemon_repairs` times within the policy's
window is not returned after its repair passes the gate. It is held drained and the
approvers are asked (critical), for as long as it takes; a release returns it, a rejection
keeps it out. An unknown count (history not read) holds nothing back.

Aspects covered (time-skipping server, the fakes of tests/workflows/test_remediation_workflow.py):
- the third repair of a node under `lemon_repairs: 3` waits for release_lemon, reminded after
  the approval timeout, and returns the node once released;
- a rejection leaves it drained under the incident, and the incident says why;
- below the limit, or with the count unknown, the node returns as before;
- the count: incidents on the node within the window that attempted a repair; the policy's
  fields are checked.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError
from temporalio.testing import WorkflowEnvironment

from autoclusters.core.incident_record import IncidentRecord, RepairAttempt
from autoclusters.core.lemon import LEMON_STEP, is_lemon, repairs_on_node
from autoclusters.core.policy import Policy, Rung
from tests.workflows.test_remediation_workflow import (
    APPROVAL_TIMEOUT_S,
    _approve,
    _fleet,
    _policy,
    _until,
    _waiting,
)


async def test_a_lemon_is_held_until_an_approver_releases_it(env: WorkflowEnvironment) -> None:
    async with _fleet(env, fixed_by=Rung.REBOOT) as f:
        req = f.request(policy=_policy(lemon_repairs=3)).model_copy(update={"prior_repairs": 2})
        handle = await f.start(req)
        held = await _until(handle, _waiting("approval", LEMON_STEP), "the lemon's hold")
        assert held.lemon and [h.passed for h in held.health] == [True]
        # Repaired and healthy, yet not returned: still drained, nothing resumed.
        assert f.slurm.node_now("gpu-01").drained and f.slurm.calls["resume"] == 0
        await env.sleep(APPROVAL_TIMEOUT_S + 1)  # skipped time: a reminder, still held
        reminded = await _until(
            handle, lambda s: any("still held" in n.text for n in f.notes()), "a reminder"
        )
        assert reminded.waiting_for is not None and f.slurm.node_now("gpu-01").drained
        await _approve(handle, LEMON_STEP, "alice")
        result = await handle.result()

    assert result.status == "resolved" and result.lemon
    assert not f.slurm.node_now("gpu-01").drained
    asked = [n for n in f.notes() if n.event == "approval_needed"]
    assert len(asked) == 1 and asked[0].severity == "critical"
    assert "is a lemon: repaired 3 times within 30 days (limit 3)" in asked[0].text
    release = result.step(LEMON_STEP)
    assert release is not None and release.detail == "released by alice"
    names = [s.name for s in result.steps]
    assert names.index("health_gate") < names.index(LEMON_STEP) < names.index("return_to_service")


async def test_a_lemon_kept_out_stays_drained(env: WorkflowEnvironment) -> None:
    async with _fleet(env, fixed_by=Rung.REBOOT) as f:
        req = f.request(policy=_policy(lemon_repairs=2)).model_copy(update={"prior_repairs": 5})
        handle = await f.start(req)
        await _until(handle, _waiting("approval", LEMON_STEP), "the lemon's hold")
        await _approve(handle, LEMON_STEP, "bob", reject=True)
        result = await handle.result()

    assert result.status == "rejected" and result.lemon
    node = f.slurm.node_now("gpu-01")
    assert node.drained and req.incident_id in node.reason
    assert f.slurm.calls["resume"] == 0
    assert result.step("return_to_service") is None


@pytest.mark.parametrize("prior", [1, None])
async def test_below_the_limit_or_unknown_the_node_returns(
    env: WorkflowEnvironment, prior: int | None
) -> None:
    async with _fleet(env, fixed_by=Rung.REBOOT) as f:
        req = f.request(policy=_policy(lemon_repairs=3)).model_copy(update={"prior_repairs": prior})
        result = await (await f.start(req)).result()

    assert result.status == "resolved" and not result.lemon
    assert result.step(LEMON_STEP) is None
    assert not f.slurm.node_now("gpu-01").drained


def _record(node: str, started: datetime, repaired: bool) -> IncidentRecord:
    repairs = [RepairAttempt(rung=Rung.REBOOT, at=started, passed=True)] if repaired else []
    return IncidentRecord(
        incident_id=f"inc-{node}-{started:%H%M}", cluster="c1", node=node, fault="XID_79",
        started_at=started, repairs=repairs,
    )  # fmt: skip


def test_the_count_and_the_rule() -> None:
    now = datetime(2026, 12, 2, tzinfo=UTC)
    records = [
        _record("gpu-01", now - timedelta(days=1), repaired=True),
        _record("gpu-01", now - timedelta(days=2), repaired=False),  # monitored: no repair
        _record("gpu-01", now - timedelta(days=40), repaired=True),  # outside the window
        _record("gpu-02", now - timedelta(days=1), repaired=True),  # another node
    ]
    assert repairs_on_node(records, "gpu-01", now - timedelta(days=30)) == 1
    policy = Policy(lemon_repairs=2)
    assert is_lemon(policy, 1) and not is_lemon(policy, 0) and not is_lemon(policy, None)
    assert not is_lemon(Policy(), 100)  # off by default
    for bad in ({"lemon_repairs": -1}, {"lemon_window_days": 0}):
        with pytest.raises(ValidationError) as caught:
            Policy(**bad)  # type: ignore[arg-type]
        assert next(iter(bad)) in str(caught.value)
