"""Lemon nodes: a machine that keeps failing is held out of service, not repaired again.

A node repaired `lemon_repairs` times within `lemon_window_days` (this incident's repair
counted) is a lemon: after its repair passes the health gate it is not returned but held
drained, and an approver decides (release it, or keep it out for the cloud's support). A
repair loop (reboot, pass, fail again, reboot...) stops at the limit instead of going on
for ever. The count is read from the node's incident histories when the incident opens.
A silent fault (a hung job, a straggler) whose node passed its screen and went back
unrepaired counts too: a node whose jobs keep hanging is a lemon, whatever each screen said.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from autoclusters.core.incident_record import IncidentRecord
from autoclusters.core.policy import Policy

LEMON_STEP = "release_lemon"  # the approval an approver gives to return a lemon


def lemon_window(policy: Policy) -> timedelta:
    return timedelta(days=policy.lemon_window_days)


def repairs_on_node(records: Iterable[IncidentRecord], node: str, since: datetime) -> int:
    """Incidents on `node` started since `since` that repaired it (one at least attempted)
    or screened it before any repair (a silent fault)."""
    return sum(
        1
        for r in records
        if r.node == node and r.started_at >= since and (r.repairs or r.screened_before_repair)
    )


def is_lemon(policy: Policy, prior_repairs: int | None) -> bool:
    """With this incident's repair, has the node reached the policy's limit? An unknown count
    (None) is not a lemon: the node passed its gate, and an unread history proves nothing."""
    if policy.lemon_repairs <= 0 or prior_repairs is None:
        return False
    return prior_repairs + 1 >= policy.lemon_repairs


def lemon_text(policy: Policy, node: str, prior_repairs: int) -> str:
    return (
        f"{node} is a lemon: repaired {prior_repairs + 1} times within "
        f"{policy.lemon_window_days:g} days (limit {policy.lemon_repairs}); held drained until "
        "an approver releases it (approve: return it; reject: keep it out for the cloud's support)"
    )
