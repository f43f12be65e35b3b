"""The recovery planner's seconds per path from the cluster's own measured history
(issue 42; core/recovery_cost.py weighs them).

Every incident under `measure_recovery` records, per planned job, the seconds from the
fault to the job stepping again on the path it took (core/recovery_loss.py). The same path
takes twice as long on a loaded cluster as on a quiet one, so one static figure per path
(the policy's `recovery_figures`) is as good as the day it was measured. The figures a plan
weighs are therefore, per path:

    the median of the last `last` measured recoveries, the policy's figure counted in
    place of each one missing below `enough`

- the median: one odd recovery (a controller that restarted in the middle, a node that
  answered late) moves it by one rank, never by its size, as a mean would be;
- the last N, not a time window: a cluster with few faults keeps a figure, and a busy
  one follows its current state within N/2 faults;
- the policy's figure as the prior: with no measurement it is the figure; with fewer
  than `enough`, it stands in for each one missing (one measurement against two priors
  is the prior still, two against one their middle), so a single first recovery never
  decides alone; from `enough` on, the measurements alone.

`borrow` is only weighed where the cluster borrows (the policy's `borrow_s` is set), and
`repair` keeps its own history (the ladder's figures: core/recovery_capacity.py). Pure: the
reading is activities/recovery_history.py's, the choice where they come from the
workflow's (a failed read weighs the policy's figures, and the plan says so).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, Field, model_validator

from autoclusters.core.recovery_cost import RecoveryFigures
from autoclusters.core.recovery_loss import RecoveryLoss

# The paths whose seconds to stepping again the history measures, and their figure.
FIGURE_OF = {"in-job": "in_job_s", "requeue": "requeue_s", "spare": "spare_s", "borrow": "borrow_s"}


class FiguresFromHistory(BaseModel):
    """The policy's `figures_from_history`: how the plan's figures follow the history."""

    # The median of the last N measured recoveries per path.
    last: int = Field(default=10, ge=1, le=200)
    # Fewer measured than this: the policy's figure stands in for each one missing.
    enough: int = Field(default=3, ge=1, le=200)
    # How far back the incidents are read (days).
    within_days: float = Field(default=30, gt=0, le=365, allow_inf_nan=False)

    @model_validator(mode="after")
    def _enough_within_last(self) -> FiguresFromHistory:
        if self.enough > self.last:
            raise ValueError(
                f"figures_from_history.enough ({self.enough}) must not exceed last ({self.last})"
            )
        return self


class MeasuredRecovery(BaseModel):
    """One job's measured recovery, as a closed incident recorded it."""

    path: str  # as the plan expected it: in-job, requeue, spare, borrow, repair
    resume_s: float  # fault -> stepping again
    closed_at: datetime  # when its incident closed: what "last" orders by


def measured_from(losses: Iterable[RecoveryLoss], closed_at: datetime) -> list[MeasuredRecovery]:
    """The recoveries one incident measured, on the path its plan expected (a loss not
    measured, "unknown", is no measurement)."""
    return [
        MeasuredRecovery(
            path=loss.estimated_path or loss.path, resume_s=loss.resume_s, closed_at=closed_at
        )
        for loss in losses
        if loss.resume_s is not None
    ]


class PathFigure(BaseModel):
    path: str
    seconds: float
    measured: int  # measurements it was taken from (at most `last`)
    prior_s: float  # the policy's figure
    priors: int = 0  # times the policy's figure stood in for a missing measurement

    def describe(self) -> str:
        if self.measured == 0:
            return f"{self.path} {self.seconds:.3g}s (the policy's: none measured)"
        if self.priors:
            return (
                f"{self.path} {self.seconds:.3g}s (median of {self.measured} measured and "
                f"the policy's {self.prior_s:.3g}s for {self.priors} more)"
            )
        return f"{self.path} {self.seconds:.3g}s (median of the last {self.measured} measured)"


class RecoveryFiguresCall(BaseModel):
    cluster: str
    prior: RecoveryFigures  # the policy's figures
    spec: FiguresFromHistory = Field(default_factory=FiguresFromHistory)


class RecoveryFiguresRead(BaseModel):
    """The figures a plan weighs, and where each came from."""

    figures: RecoveryFigures
    paths: list[PathFigure] = Field(default_factory=list)
    incidents: int = 0  # closed incidents read

    def describe(self) -> str:
        body = "; ".join(p.describe() for p in self.paths)
        return f"measured history ({self.incidents} incidents): {body}"


def figure_from(measured: list[float], prior: float, *, last: int, enough: int) -> float:
    """The median of the last `last` measurements (oldest first), with `prior` in place of
    each one missing below `enough`."""
    recent = measured[-last:]
    return float(statistics.median([*recent, *[prior] * max(0, enough - len(recent))]))


def figures_from_history(
    samples: Iterable[MeasuredRecovery],
    prior: RecoveryFigures,
    spec: FiguresFromHistory,
    *,
    incidents: int = 0,
) -> RecoveryFiguresRead:
    """The figures per path from the measured recoveries (any order) over the prior."""
    by_path: dict[str, list[MeasuredRecovery]] = {}
    for s in samples:
        by_path.setdefault(s.path, []).append(s)
    update: dict[str, float] = {}
    paths = []
    for path, field in FIGURE_OF.items():
        prior_s = getattr(prior, field)
        if prior_s is None:
            continue  # this cluster does not borrow: nothing to weigh
        ordered = [s.resume_s for s in sorted(by_path.get(path, []), key=lambda s: s.closed_at)]
        seconds = figure_from(ordered, prior_s, last=spec.last, enough=spec.enough)
        update[field] = round(seconds, 3)
        paths.append(
            PathFigure(
                path=path,
                seconds=update[field],
                measured=min(len(ordered), spec.last),
                prior_s=prior_s,
                priors=max(0, spec.enough - len(ordered)),
            )
        )
    return RecoveryFiguresRead(
        figures=prior.model_copy(update=update), paths=paths, incidents=incidents
    )
