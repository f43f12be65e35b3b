"""The recovery planner's figures from the cluster's measured history (issue 42;
core/recovery_history.py, core/loss_clock.py):

- the statistic: the median of the last N measured recoveries per path, the policy's
  figure standing in for each one missing below `enough`; ordered by when the incidents
  closed, not by the order they were read; one odd recovery moves it by a rank only;
- what it weighs: in-job, requeue, spare, and borrow only where the cluster borrows; a
  repair's figure is the ladder's, untouched;
- the policy's `figures_from_history` refuses `enough` above `last`;
- where the loss is counted from: the fault's start as its source saw it, within
  DETECTION_MAX_S of the opening, else the opening.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from autoclusters.core.loss_clock import DETECTION_MAX_S, loss_starts
from autoclusters.core.models import FaultSeen, IncidentRequest, IncidentState
from autoclusters.core.recovery_cost import RecoveryFigures
from autoclusters.core.recovery_history import (
    FiguresFromHistory,
    MeasuredRecovery,
    figure_from,
    figures_from_history,
)

PRIOR = RecoveryFigures(in_job_s=1.5, requeue_s=20)
T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _measured(path: str, *seconds: float, start: int = 0) -> list[MeasuredRecovery]:
    return [
        MeasuredRecovery(path=path, resume_s=s, closed_at=T0 + timedelta(minutes=start + i))
        for i, s in enumerate(seconds)
    ]


def test_no_measurement_is_the_policys_figure() -> None:
    assert figure_from([], 20.0, last=10, enough=3) == 20.0


def test_the_prior_stands_in_for_each_missing_measurement() -> None:
    # One against two priors: the prior still; two against one: their middle.
    assert figure_from([30.0], 20.0, last=10, enough=3) == 20.0
    assert figure_from([30.0, 31.0], 20.0, last=10, enough=3) == 30.0
    # Enough: the measurements alone.
    assert figure_from([30.0, 31.0, 32.0], 20.0, last=10, enough=3) == 31.0


def test_only_the_last_n_count_and_one_outlier_moves_it_by_a_rank() -> None:
    old = [10.0] * 20
    recent = [30.0, 29.0, 31.0, 30.0, 400.0]  # a controller restart in the middle of one
    assert figure_from([*old, *recent], 20.0, last=5, enough=3) == 30.0


def test_figures_follow_the_last_recoveries_per_path_by_close_time() -> None:
    spec = FiguresFromHistory(last=3, enough=2)
    # A quiet morning, then a loaded afternoon: the last three of each path decide.
    samples = [
        *_measured("requeue", 15, 14, 16),
        *_measured("requeue", 31, 29, 30, start=60),
        *_measured("in-job", 1.1, 1.2, start=0),
        *_measured("in-job", 2.9, 3.0, 2.8, start=60),
    ]
    read = figures_from_history(list(reversed(samples)), PRIOR, spec, incidents=9)
    assert read.figures.requeue_s == 30.0
    assert read.figures.in_job_s == 2.9
    assert read.figures.spare_s == PRIOR.spare_s  # none measured: the policy's
    assert read.figures.repair_s == PRIOR.repair_s  # the ladder's history decides it
    assert read.figures.borrow_s is None  # this cluster does not borrow: nothing weighed
    by_path = {p.path: p for p in read.paths}
    assert set(by_path) == {"in-job", "requeue", "spare"}
    assert by_path["requeue"].measured == 3 and by_path["spare"].measured == 0
    text = read.describe()
    assert "9 incidents" in text and "requeue 30s (median of the last 3 measured)" in text
    assert "spare 45s (the policy's: none measured)" in text


def test_a_cluster_that_borrows_gets_its_borrow_figure_measured() -> None:
    prior = PRIOR.model_copy(update={"borrow_s": 27.0})
    read = figures_from_history(
        _measured("borrow", 40), prior, FiguresFromHistory(last=10, enough=2)
    )
    assert read.figures.borrow_s == 33.5  # one measured against the prior: their middle
    (borrow,) = [p for p in read.paths if p.path == "borrow"]
    assert borrow.priors == 1 and "the policy's 27s for 1 more" in borrow.describe()


def test_enough_above_last_is_refused() -> None:
    with pytest.raises(ValidationError, match="enough"):
        FiguresFromHistory(last=3, enough=5)


OPENED = datetime(2026, 12, 5, 12, 0, 10, tzinfo=UTC)


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (OPENED - timedelta(seconds=0.3), OPENED - timedelta(seconds=0.3)),  # the agent's
        (None, OPENED),  # no source said
        (OPENED + timedelta(seconds=1), OPENED),  # after the opening: not its start
        (OPENED - timedelta(seconds=DETECTION_MAX_S + 1), OPENED),  # a standing condition
        (datetime(2026, 12, 5, 12, 0, 9), datetime(2026, 12, 5, 12, 0, 9, tzinfo=UTC)),
    ],
)
def test_the_loss_counts_from_the_faults_start(seen: datetime | None, expected: datetime) -> None:
    assert loss_starts(OPENED, seen) == expected


def test_the_incident_counts_from_its_opening_faults_first_sighting() -> None:
    req = IncidentRequest(
        incident_id="INC-1", cluster="c", node="gpu-01", fault="XID_79", opened_at=OPENED
    )
    early = OPENED - timedelta(seconds=0.25)
    state = IncidentState(
        request=req,
        faults=[
            FaultSeen(fault="XID_48", source="agent", first_at=early - timedelta(seconds=5),
                      last_at=early),
            FaultSeen(fault="XID_79", source="agent", first_at=early, last_at=OPENED),
        ],
    )  # fmt: skip
    assert state.loss_starts() == early
