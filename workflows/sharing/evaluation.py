"""One evaluation: read the demand (Prometheus, Slurm, both pools), then the verdict of
`core.sharing.decide` (hysteresis, sustain, cooldown, min training / max inference) on it,
with the streaks it carries to the next. Whether a node moves is the workflow's to act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from autoclusters.activities import contracts
    from autoclusters.core.sharing import Demand, DemandCall, Verdict, decide
    from autoclusters.core.sharing_borrow import note_lost

from autoclusters.workflows.outage import outage_of
from autoclusters.workflows.sharing.run import SharingRun
from autoclusters.workflows.steps import cause_of

# docs/versioning.md: a return also waits for the request rate to fall (core/sharing.py decide).
# Patch ids keep the workflow's old module name: recorded histories carry them.
RETURN_WAITS_FOR_THE_RATE = "gpu_rebalance-0.2-return-waits-for-the-rate"


@dataclass(frozen=True)
class Evaluation:
    """The figures read (a node a human holds marked as in an incident), the verdict on
    them, and whether borrowing for training is in play."""

    demand: Demand
    verdict: Verdict
    borrowing: bool


async def read_demand(sh: SharingRun) -> Demand | None:
    """The demand now; None when a source is away (no figure is not a calm figure)."""
    try:
        return await sh.steps.call(
            contracts.share_read_demand,
            DemandCall(cluster=sh.cluster, policy=sh.policy, pools=dict(sh.state.pools)),
            f"read inference and training demand on cluster {sh.cluster}",
            timeout=timedelta(minutes=1),
        )
    except ActivityError as err:
        if outage_of(err) is None:
            raise
        # Prometheus, Slurm or Kubernetes away: hold this evaluation (no move, streaks
        # unchanged) and look again next interval.
        workflow.logger.warning("sharing workflow holds: demand unreadable (%s)", cause_of(err))
        return None


def evaluate(sh: SharingRun, demand: Demand) -> Evaluation:
    """The verdict on `demand`, kept on the state with the figures it was made on."""
    s = sh.state
    if s.unhealthy:
        # A node that failed its gate on the way back is drained, idle and labelled
        # training: to the figures, the cheapest node to lend. It is a human's until
        # they clear it; neither pool may take it meanwhile.
        demand = demand.model_copy(
            update={
                "nodes": [
                    n.model_copy(update={"in_incident": True}) if n.name in s.unhealthy else n
                    for n in demand.nodes
                ]
            }
        )
    for n in demand.nodes:
        s.pools.setdefault(n.name, n.pool)
    # Borrowed from inference: only a policy that allows it, or a borrow still out,
    # reaches this (no command before a borrow: older histories replay as they were).
    borrowing = sh.policy.borrow_from_inference or any(b.active for b in s.borrows)
    if borrowing:
        s.lost = note_lost(
            s.last_demand,
            demand,
            s.lost,
            at=workflow.now().timestamp(),
            borrowed={b.node for b in s.borrows if b.active},
        )
    since = None if s.last_move_end is None else workflow.now().timestamp() - s.last_move_end
    # 0.1 returned on a calm latency alone, whatever the request rate.
    rate_guard = workflow.patched(RETURN_WAITS_FOR_THE_RATE)
    verdict = decide(
        demand,
        sh.policy,
        breach_streak=s.breach_streak,
        calm_streak=s.calm_streak,
        seconds_since_last_move=since,
        lend_rps=last_lend_rps(sh) if rate_guard else None,
    )
    s.breach_streak, s.calm_streak = verdict.breach_streak, verdict.calm_streak
    s.last_demand, s.last_verdict = demand, verdict
    return Evaluation(demand=demand, verdict=verdict, borrowing=borrowing)


def last_lend_rps(sh: SharingRun) -> float | None:
    """The request rate that needed the latest lend the sharing workflow made."""
    for rec in reversed(sh.state.moves):
        if rec.move.to == "inference" and rec.status == "done":
            return rec.move.demand.inference_rps if rec.move.demand else None
    return None
