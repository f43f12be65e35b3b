"""How an incident counts what its sources said (workflows/fault_intake.py), without a
server: the API sends a node's alerts of one kind that arrived together as one report,
and an incident its storm path started carries its opening alerts in the request.

Aspects covered:
- a report standing for several alerts counts each, on a new kind and on a known one;
- the opening report (the request's own token) adds its alerts beyond the first, which
  the request counted already, and is the one told `opened`;
- a report seen before (its key) is a repeat and counts nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime

from autoclusters.core.models import FaultReport, FaultSeen, IncidentRequest, IncidentState
from autoclusters.workflows.fault_intake import FaultIntake

AT = datetime(2026, 5, 1, 10, tzinfo=UTC)


def intake(token: str = "t0") -> FaultIntake:
    req = IncidentRequest(
        incident_id="inc-1", cluster="c", node="gpu-001", fault="XID_79", opened_at=AT,
        open_token=token,
    )  # fmt: skip
    seen = FaultSeen(fault="XID_79", source="alertmanager", first_at=AT, last_at=AT)
    return FaultIntake(IncidentState(request=req, faults=[seen]))


def report(fault: str, key: str, alerts: int = 1, token: str = "") -> FaultReport:
    return FaultReport(
        incident_id="inc-1", fault=fault, source="alertmanager", at=AT, key=key,
        alerts=alerts, open_token=token,
    )  # fmt: skip


def counts(i: FaultIntake) -> list[tuple[str, int]]:
    return [(f.fault, f.count) for f in i.state.faults]


def test_a_report_of_several_alerts_counts_each() -> None:
    i = intake()
    i.merge(report("ECC_DBE", "k1", alerts=5, token="other"))
    i.merge(report("XID_79", "k2", alerts=3, token="other"))
    i.merge(report("ECC_DBE", "k3", token="other"))
    assert counts(i) == [("XID_79", 4), ("ECC_DBE", 6)]


def test_the_opening_report_adds_the_alerts_beyond_the_first() -> None:
    i = intake(token="t0")
    ack, _ = i.merge(report("XID_79", "k1", alerts=7, token="t0"))
    assert ack.opened and not ack.joined
    assert counts(i) == [("XID_79", 7)]
    # The same token again is not a second opening: it joins.
    again, _ = i.merge(report("ECC_DBE", "k2", alerts=2, token="t0"))
    assert not again.opened and again.joined
    assert counts(i) == [("XID_79", 7), ("ECC_DBE", 2)]


def test_a_report_seen_before_counts_nothing() -> None:
    i = intake()
    i.merge(report("ECC_DBE", "k1", alerts=4, token="other"))
    ack, added = i.merge(report("ECC_DBE", "k1", alerts=4, token="other"))
    assert ack.repeat and added is None
    assert counts(i) == [("XID_79", 1), ("ECC_DBE", 4)]
