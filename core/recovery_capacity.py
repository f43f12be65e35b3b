"""What an incident knows of the capacity its jobs may start again on, for the recovery
plan (core/recovery_cost.py): whether a hot spare can take the node's place, and how long
the repair has taken on this cluster.

Decided in the workflow from the policy snapshot alone (pure, no clock): the spares the
policy lists (a spare goes into service when the machine is replaced), and the ladder's
figures the incident was opened with (`Policy.ladder`, the cluster's history as `autoclusters
stats ladder` shows it: the median time to the node back in service for this fault and
rung); without them the figures' `repair_s` stands.
"""

from __future__ import annotations

from autoclusters.core.policy import Policy, Rung
from autoclusters.core.recovery_cost import RecoveryCapacity


def capacity_for(policy: Policy, fault: str, rung: str | None) -> RecoveryCapacity:
    cap = RecoveryCapacity()
    if not policy.guard.spares:
        cap.spare_blocked = "the policy lists no hot spare"
    elif rung != Rung.REPLACE.value:
        cap.spare_blocked = f"a spare serves at a replacement, the rung is {rung}"
    else:
        cap.spare_blocked = None
    row = policy.ladder.of(fault, rung) if policy.ladder is not None and rung else None
    if row is not None and row.median_capacity_s is not None:
        cap.repair_s = row.median_capacity_s
        cap.repair_from = f"median of {row.successes} {rung} of {fault} in the history"
    else:
        cap.repair_from = "no history for this fault and rung: the figures' repair_s"
    return cap
