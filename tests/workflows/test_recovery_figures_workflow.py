"""The recovery plan weighs the cluster's measured figures, through the runbook (issue 42;
workflows/recovery_figures_steps.py): under a policy with `figures_from_history`, the
incident reads the recoveries its cluster measured beside the drain, and its requeue step
plans with their median per path, the plan (and the Slack card) saying where the figures
came from; a read that fails plans with the policy's figures and says why; a policy
without it reads nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment

from autoclusters.activities.recovery_history import HistoryRead, RecoveryHistoryActivities
from autoclusters.core.recovery_history import FiguresFromHistory, MeasuredRecovery
from tests.helpers import time_skipping_env
from tests.workflows.test_remediation_workflow import RUNBOOK, _fleet, _policy

CLOSED = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
# What the cluster's last incidents measured of the requeue path: a loaded afternoon.
MEASURED = [31.0, 29.0, 33.0, 30.0]


@pytest_asyncio.fixture
async def env() -> AsyncIterator[WorkflowEnvironment]:
    async with await time_skipping_env() as environment:
        yield environment


class _History:
    """Stands in for the Temporal read: the measured recoveries, or a failure."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.fail = fail
        self.asked: list[str] = []

    async def recent(self, cluster: str, within: timedelta) -> HistoryRead:
        self.asked.append(cluster)
        if self.fail is not None:
            raise self.fail
        return HistoryRead(
            incidents=len(MEASURED),
            samples=[
                MeasuredRecovery(path="requeue", resume_s=s, closed_at=CLOSED + timedelta(i))
                for i, s in enumerate(MEASURED)
            ],
        )


@pytest.mark.parametrize("read", ["measured", "failed", "off"])
async def test_the_plan_weighs_the_clusters_measured_figures(
    env: WorkflowEnvironment, read: str
) -> None:
    history = _History(fail=RuntimeError("visibility down") if read == "failed" else None)
    spec = FiguresFromHistory(last=10, enough=3) if read != "off" else None
    async with _fleet(
        env, nodes=4, extra_activities=[RecoveryHistoryActivities(history.recent).recovery_figures]
    ) as f:  # gpu-04 is free: job 101 restarts at once
        req = f.request(policy=_policy(figures_from_history=spec, announce_recovery=True))
        result = await (await f.start(req)).result()
        notes = f.notes("gpu-01")

    assert result.status == "resolved", result.error
    # The read is no step of its own; the Slack card follows the requeue.
    at = RUNBOOK.index("requeue") + 1
    assert [s.name for s in result.steps] == [
        *RUNBOOK[:at],
        "notify_recovery_chosen",
        *RUNBOOK[at:],
    ]
    plan = next(p for p in result.recovery_plans if p.job_id == 101)
    assert plan.chosen == "requeue"
    requeue = plan.estimate("requeue")
    assert requeue is not None
    chosen = next(n for n in notes if n.event == "recovery_chosen")
    if read == "off":
        assert history.asked == [] and plan.figures_from == ""
        assert requeue.resume_s == req.policy.recovery_figures.requeue_s  # type: ignore[union-attr]
        return
    assert history.asked == [req.cluster]
    if read == "measured":
        assert requeue.resume_s == 30.5  # the median of the four measured, not the policy's 20
        assert plan.figures_from.startswith("measured history (4 incidents)")
        assert "requeue 30.5s (median of the last 4 measured)" in plan.figures_from
    else:
        assert requeue.resume_s == 20.0  # the policy's
        assert "the policy's figures: the measured history could not be read" in (plan.figures_from)
        assert "visibility down" in plan.figures_from
    assert f"figures: {plan.figures_from}" in chosen.text
