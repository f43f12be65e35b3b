"""`fence: at_once` (issue 39): a fault after which the node cannot end its jobs' processes
(a GPU fallen off the bus, a node gone) has its requeued jobs fenced as soon as Slurm shows
them completing there; any other fault's first waits `fence_after_s` (3 s). The workflow
passes the rule's choice to the requeue step (tests/activities/test_requeue_stuck_node.py
runs the step itself), and the shipped policy says `at_once` for the faults that hang a
rank in the driver or take the node away."""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from autoclusters.core.models import FENCE_AFTER_S
from autoclusters.core.policy import FaultRule, Rung, default_policy
from tests.workflows.test_remediation_workflow import FAULTS, _fleet, _policy


async def _requeue_input(env: WorkflowEnvironment, rule: FaultRule) -> dict[str, object]:
    async with _fleet(env) as f:
        req = f.request(fault="XID_79", policy=_policy(faults={**FAULTS, "XID_79": rule}))
        handle = await f.start(req)
        assert (await handle.result()).status == "resolved"
        history = await handle.fetch_history()
    (scheduled,) = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "requeue_jobs"
    ]
    found: dict[str, object] = json.loads(scheduled.input.payloads[0].data)
    return found


@pytest.mark.parametrize(("fence", "after_s"), [("at_once", 0.0), ("when_stuck", FENCE_AFTER_S)])
async def test_the_rule_sets_how_long_the_requeue_step_waits_before_it_fences(
    env: WorkflowEnvironment, fence: str, after_s: float
) -> None:
    rule = FaultRule(severity="critical", first_rung=Rung.REBOOT, fence=fence)  # type: ignore[arg-type]
    assert (await _requeue_input(env, rule))["fence_after_s"] == after_s


def test_a_rule_without_fence_waits_first() -> None:
    """A policy snapshot from before the field replays as it ran."""
    assert FaultRule(severity="critical", first_rung=Rung.REBOOT).fence == "when_stuck"


def test_the_shipped_policy_fences_at_once_only_where_the_node_cannot_end_its_jobs() -> None:
    policy = default_policy()
    at_once = sorted(k for k, rule in policy.faults.items() if rule.fence == "at_once")
    assert at_once == [
        "GPU_DRIVER_UNRESPONSIVE", "GPU_FELL_OFF_BUS", "HCA_FELL_OFF_BUS", "IB_LINK_DOWN",
        "NODE_NOT_READY", "XID_79",
    ]  # fmt: skip
    # A fault whose jobs can still save on the requeue's signal is never fenced at once.
    for kind in ("ROW_REMAP_PENDING", "SLOW_NODE", "ECC_DBE", "XID_13", "THERMAL"):
        assert policy.rule_for(kind).fence == "when_stuck", kind
