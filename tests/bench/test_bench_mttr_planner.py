"""bench/mttr_planner.py: the planner's estimate beside the loss bench/mttr.py measured,
per fault and over the run (issue 42's ±30 % target), on made-up figures."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autoclusters.core.models import IncidentRequest, IncidentState
from autoclusters.core.recovery_cost import JobFacts, RecoveryFigures, plan_recovery
from tests.helpers import load_bench

planner = load_bench("mttr_planner")
FIGURES = RecoveryFigures(in_job_s=1.5, requeue_s=20)


def _state(job_id: int, *, in_job: bool, ckpt_age: float) -> IncidentState:
    req = IncidentRequest(incident_id="inc-1", cluster="bench", node="gpu-02", fault="XID_79",
                          opened_at=datetime(2026, 12, 5, tzinfo=UTC))  # fmt: skip
    plan = plan_recovery(
        JobFacts(
            job_id=job_id,
            gpus=3,
            checkpoint_age_s=ckpt_age,
            in_job_blocked=None if in_job else "the batch host",
            free_nodes=1,
        ),  # fmt: skip
        FIGURES,
    )
    return IncidentState(request=req, recovery_plans=[plan])


def test_each_fault_sets_the_estimate_beside_the_measured_loss() -> None:
    # In place: estimated 1.5 s of 3 GPUs, the job stepped again after 1.2 s.
    row = planner.planner_row(_state(5, in_job=True, ckpt_age=3), 5, "in-job", 1.2)
    assert row["estimated path"] == "in-job" and row["estimate (s)"] == 1.5
    assert row["estimate (GPU-h)"] == pytest.approx(3 * 1.5 / 3600)
    assert row["measured (GPU-h)"] == pytest.approx(3 * 1.2 / 3600)
    assert row["off by"] == pytest.approx((1.2 - 1.5) / 1.2)
    assert "(-25% off)" in planner.planner_line(row)
    assert "the runbook measured not measured" in planner.planner_line(row)
    # No plan for the job (nothing the planner saw): said, and left out of the summary.
    assert planner.planner_row(_state(5, in_job=True, ckpt_age=3), 6, "requeue", 9) == {
        "planned": False
    }


def test_the_summary_counts_the_faults_within_30_percent() -> None:
    rows = [
        planner.planner_row(_state(5, in_job=True, ckpt_age=3), 5, "in-job", 1.2),  # -25 %
        planner.planner_row(_state(6, in_job=False, ckpt_age=3), 6, "requeue", 40.0),  # +43 %
        planner.planner_row(_state(7, in_job=False, ckpt_age=3), 7, "requeue", None),
        {"planned": False},
    ]
    line, figures = planner.planner_summary(rows)
    assert line.startswith("planner's estimate within ±30% of the measured loss: 1 of 2 faults")
    assert "1 not measured" in line
    assert figures["within"] == 1 and figures["worst_error"] == pytest.approx(0.425)
