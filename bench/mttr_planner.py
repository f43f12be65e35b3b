"""The recovery planner's estimate beside the loss the bench measured (issue 42's target:
the estimate within ±30 % of the measured loss over bench/mttr.py's faults).

Per fault: the planner's estimate for the path the job took (core/recovery_cost.py:
the job's GPUs × (the policy's seconds to stepping again + the work since its checkpoint),
`RecoveryPlan.expected_for`), the bench's measured loss (the same GPUs × (fault → its first
step at full width, from the job's log + the steps it did again × its step period)), and
the runbook's own measurement at the close (policy measure_recovery; core/recovery_loss.py),
which reads the job's Slurm comment rather than its log.
"""

from __future__ import annotations

from typing import Any

from autoclusters.core.models import IncidentState
from autoclusters.core.recovery_loss import WITHIN, RecoveryLoss, estimate_quality


def planner_row(
    state: IncidentState, job_id: int, path: str | None, work_lost_s: float | None
) -> dict[str, Any]:
    """The planner's figures for one fault's job: estimate, measured, the runbook's own."""
    plan = next((p for p in state.recovery_plans if p.job_id == job_id), None)
    if plan is None:
        return {"planned": False}
    expected = plan.expected_for(path or "requeue")
    loss = RecoveryLoss(
        job_id=job_id,
        path=path or "requeue",
        estimated_path=expected.path if expected is not None else "",
        gpus=plan.gpus,
        estimate_gpu_hours=expected.gpu_hours if expected is not None else None,
        actual_gpu_hours=plan.gpus * work_lost_s / 3600 if work_lost_s is not None else None,
    )
    own = next((x for x in state.recovery_losses if x.job_id == job_id), None)
    return {
        "planned": True,
        "chosen": plan.chosen,
        "estimated path": loss.estimated_path,
        "gpus": plan.gpus,
        "estimate (s)": expected.resume_s + expected.redo_s if expected is not None else None,
        "estimate (GPU-h)": loss.estimate_gpu_hours,
        "measured (GPU-h)": loss.actual_gpu_hours,
        "off by": loss.error,
        "runbook measured (GPU-h)": own.actual_gpu_hours if own is not None else None,
        "runbook measured why": own.why_unknown if own is not None else "not measured",
        "figures from": plan.figures_from or "the policy's",
    }


def planner_line(row: dict[str, Any]) -> str:
    if not row.get("planned"):
        return "  planner: no plan for the job"
    est, got, off = row["estimate (GPU-h)"], row["measured (GPU-h)"], row["off by"]
    own = row["runbook measured (GPU-h)"]
    own_text = _gpu_h(own) if own is not None else row["runbook measured why"]
    return (
        f"  planner: estimate {_gpu_h(est)} ({row['estimated path']}, {row['estimate (s)']:.1f}s"
        f" × {row['gpus']}) vs measured {_gpu_h(got)}"
        + (f" ({off:+.0%} off)" if off is not None else "")
        + f"; the runbook measured {own_text}"
    )


def _gpu_h(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g} GPU-h"


def planner_summary(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The target's line: how many faults' estimates were within ±30 % of the measured loss."""
    losses = [
        RecoveryLoss(
            job_id=0,
            path="",
            gpus=1,
            estimate_gpu_hours=r.get("estimate (GPU-h)"),
            actual_gpu_hours=r.get("measured (GPU-h)"),
        )  # fmt: skip
        for r in rows
        if r.get("planned")
    ]
    q = estimate_quality(losses)
    if not q.measured:
        return "planner: no fault with both an estimate and a measured loss", q.model_dump()
    line = (
        f"planner's estimate within ±{WITHIN:.0%} of the measured loss: {q.within} of "
        f"{q.measured} faults (median off by {q.median_error:.0%}, worst {q.worst_error:.0%}"
        f"{f'; {q.unknown} not measured' if q.unknown else ''})"
    )
    return line, q.model_dump()
