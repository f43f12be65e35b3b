"""How an open incident takes in what its sources say: one more alert for the node (merged,
never a second drain), the evidence that came with it, and the word that a fault cleared.

- Exactly one caller is told it `opened` the incident: the one whose token the opening
  request carries (three parallel opens on one node: one `opened`, two `joined`).
- A report whose source key was recorded before is answered `repeat` and changes nothing,
  so a retried alert (after an API restart, say) is never counted twice; a report the API
  sent for several alerts at once counts each (`FaultReport.alerts`).
- A fault's time is when its source saw it start (an alert's startsAt), not when it arrived.
- A cleared fault is recorded on the incident; it never stops a repair already decided.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from autoclusters.core.fault_evidence import KEEP_PER_FAULT, FaultCleared, utc
    from autoclusters.core.models import FaultAck, FaultReport, FaultSeen, IncidentState

KEEP_KEYS = 500  # source keys remembered for `repeat` (a few days of re-sent alerts)


class FaultIntake:
    def __init__(self, state: IncidentState) -> None:
        self.state = state
        self.keys: list[str] = []  # source keys seen, newest last
        self.told_opened = False  # an ack said `opened` already

    def merge(self, rep: FaultReport) -> tuple[FaultAck, FaultSeen | None]:
        """Record `rep`; the answer, and the fault it added (None: known already)."""
        s = self.state
        keys = self.keys
        if rep.key and rep.key in keys:
            ack = FaultAck(
                incident_id=s.request.incident_id,
                joined=True,
                rung=s.rung,
                status=s.status,
                repeat=True,
            )
            return ack, None
        if rep.key:
            keys.append(rep.key)
            del keys[:-KEEP_KEYS]
        if rep.open_token:
            opened = rep.open_token == s.request.open_token and not self.told_opened
            self.told_opened = self.told_opened or opened
        else:  # callers from before tokens: the would-be incident id tells
            opened = rep.incident_id == s.request.incident_id
        at = utc(rep.at)
        seen = next((f for f in s.faults if f.fault == rep.fault), None)
        added = None
        if seen is None:
            seen = added = FaultSeen(
                fault=rep.fault, source=rep.source, first_at=at, last_at=at, count=rep.alerts
            )
            s.faults.append(seen)
        elif not opened:
            seen.count += rep.alerts
            seen.last_at = max(utc(seen.last_at), at)
            if seen.resolved_at is not None and at > utc(seen.resolved_at):
                seen.resolved_at = seen.resolved_by = None  # it came back
        else:  # the opening request counted its first alert; the report may carry more
            seen.count += rep.alerts - 1
        if at < utc(seen.first_at):
            seen.first_at = at  # the source saw it start before we heard of it
        if rep.evidence is not None:
            seen.evidence.append(rep.evidence)
            if len(seen.evidence) > KEEP_PER_FAULT:
                del seen.evidence[1 : len(seen.evidence) - KEEP_PER_FAULT + 1]  # keep the first
        ack = FaultAck(
            incident_id=s.request.incident_id,
            joined=not opened,
            rung=s.rung,
            status=s.status,
            opened=opened,
        )
        return ack, added

    def clear(self, c: FaultCleared) -> bool:
        seen = next((f for f in self.state.faults if f.fault == c.fault), None)
        if seen is None:
            return False
        seen.resolved_at, seen.resolved_by = utc(c.resolved_at), c.source
        return True

    def check_cleared(self, c: FaultCleared) -> None:
        s = self.state
        if s.status != "open":
            raise ValueError(f"incident {s.request.incident_id} is closed")
        if all(f.fault != c.fault for f in s.faults):
            raise ValueError(f"{c.fault} is not a fault of incident {s.request.incident_id}")
