"""The figures the recovery plan weighs, from the cluster's measured history (issue 42):
with the policy's `figures_from_history`, the incident reads the recoveries its cluster's
closed incidents measured (activities/recovery_history.py) while it drains the node, and
its requeue step plans with the median of the last ones per path (core/recovery_history.py).

Never a reason to hold the jobs up or to fail: the read gets one short try, and a read
that fails or is slow plans with the policy's `recovery_figures`, the plan saying so.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.recovery_cost import RecoveryFigures
    from autoclusters.core.recovery_history import FiguresFromHistory, RecoveryFiguresCall

from autoclusters.workflows.incident import Incident
from autoclusters.workflows.steps import cause_of

# One try, briefly: the jobs' requeue waits for the read, and a slow or failed one costs
# only the figures' freshness.
FIGURES_TIMEOUT = timedelta(seconds=3)
FIGURES_RETRY = RetryPolicy(maximum_attempts=1)


async def figures_for_plan(inc: Incident, spec: FiguresFromHistory) -> tuple[RecoveryFigures, str]:
    """The seconds per path the plan weighs, and where they came from."""
    req, p = inc.request, inc.policy
    try:
        read = await inc.steps.call(
            contracts.recovery_figures,
            RecoveryFiguresCall(cluster=req.cluster, prior=p.recovery_figures, spec=spec),
            f"read the recoveries {req.cluster} measured",
            timeout=FIGURES_TIMEOUT,
            heartbeat=None,
            retry=FIGURES_RETRY,
        )
    except (ActivityError, ApplicationError) as err:
        return p.recovery_figures, (
            f"the policy's figures: the measured history could not be read ({cause_of(err)})"
        )
    return read.figures, read.describe()
