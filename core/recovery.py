"""Job and capacity recovery, read off a closed incident's timeline (pure).

Both clocks start when the incident opened (`request.opened_at`: the alert's arrival):
- job recovery ends when the node's jobs were requeued and released (the `requeue` step
  finished): from then on they can restart elsewhere, whatever the repair takes. The
  job's own restart (its launcher, its checkpoint) is not seen by the worker;
- capacity recovery ends when the cluster has the capacity back: a hot spare in service in
  the node's place (`take_spare`), else the node itself returned (`return_to_service`).
"""

from __future__ import annotations

from datetime import datetime

from autoclusters.core.models import IncidentState


def _finished_ok(s: IncidentState, name: str) -> datetime | None:
    step = s.step(name)
    return step.finished_at if step is not None and step.outcome == "ok" else None


def job_recovery(s: IncidentState) -> float | None:
    """Seconds to the jobs requeued; None when the node had no requeueable job."""
    done = _finished_ok(s, "requeue")
    if done is None or not s.requeued_jobs:
        return None
    return (done - s.request.opened_at).total_seconds()


def capacity_recovery(s: IncidentState) -> tuple[float, str] | None:
    """Seconds to the capacity back, and how (`spare` or `repair`); None unless resolved."""
    if s.status != "resolved":
        return None
    spare = _finished_ok(s, "take_spare") if s.spare_node else None
    back = spare or _finished_ok(s, "return_to_service") or s.closed_at
    if back is None:
        return None
    return (back - s.request.opened_at).total_seconds(), "spare" if spare else "repair"
