"""The fleet page (clients/console/fleet.py): figures read off the incidents' timelines.

- incidents per day by fault, counted on the day they opened, within the range only;
- jobs back and capacity back by fault and rung, as the worker's metrics measure them;
- the share of repairs on each rung that passed their health gate;
- node availability and the work lost: node-hours out of service (opened -> capacity back,
  an open incident to the range's end), GPU-hours, job-hours waiting for the requeue;
- over HTTP: the page and its JSON, the range asked, a bad range refused naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import pytest_asyncio

from autoclusters.clients.console import fleet
from autoclusters.core.models import IncidentRequest, IncidentState
from tests.fake_fleet import FleetSource, timeline
from tests.test_console_shared_read import AUTH, fleet_app

NOW = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


def closed(
    node: str, fault: str, rung: str, opened: datetime, plan: list[tuple[str, float, str]]
) -> IncidentState:
    steps = timeline(opened, plan)
    gate = next((s for s in steps if s.name == "health_gate"), None)
    resolved = gate is None or gate.outcome == "ok"
    req = IncidentRequest(incident_id=f"inc-{node}-{opened:%H%M}", cluster="c1", node=node,
                          fault=fault, opened_at=opened, opened_by="agent")  # fmt: skip
    status = "resolved" if resolved else "failed"
    return IncidentState(request=req, status=status, rung=rung, steps=steps,
                         requeued_jobs=[7, 8], closed_at=steps[-1].finished_at)  # fmt: skip


def test_figures_come_from_the_incidents_timelines() -> None:
    day = timedelta(days=1)
    a = closed("n1", "XID_79", "reboot", NOW - timedelta(hours=2),
               [("drain", 1, "ok"), ("requeue", 4, "ok"), ("repair", 295, "ok"),
                ("health_gate", 60, "ok"), ("return_to_service", 0, "ok")])  # fmt: skip
    b = closed("n2", "XID_79", "reboot", NOW - day - timedelta(hours=1),
               [("drain", 1, "ok"), ("requeue", 9, "ok"), ("repair", 290, "ok"),
                ("health_gate", 300, "failed")])  # fmt: skip
    c = closed("n3", "ECC_DBE", "replace", NOW - timedelta(hours=5),
               [("drain", 2, "ok"), ("requeue", 2, "ok"), ("take_spare", 26, "ok"),
                ("repair", 3000, "ok"), ("health_gate", 60, "ok")])  # fmt: skip
    c.spare_node = "spare-1"
    old = closed("n4", "XID_48", "reboot", NOW - 9 * day, [("drain", 1, "ok")])
    still_open = IncidentState(request=IncidentRequest(
        incident_id="inc-n5", cluster="c1", node="n5", fault="XID_94",
        opened_at=NOW - timedelta(hours=1), opened_by="agent"))  # fmt: skip
    view = fleet.figures([a, b, c, old, still_open], span="7d", now=NOW, nodes=10)
    assert view.incidents == 4  # the 9-day-old one is outside 7 days
    assert view.days[0] == "2026-11-26" and view.days[-1] == "2026-12-02"
    assert view.per_day == {"ECC_DBE": [0, 0, 0, 0, 0, 0, 1], "XID_79": [0, 0, 0, 0, 0, 1, 1],
                            "XID_94": [0, 0, 0, 0, 0, 0, 1]}  # fmt: skip
    rows = {(r.fault, r.rung): r for r in view.recovery}
    assert (rows[("XID_79", "reboot")].incidents, rows[("XID_79", "reboot")].job_back_p50_s) == (
        2, 7.5)  # fmt: skip
    assert rows[("XID_79", "reboot")].capacity_back_p50_s == 360.0  # only a came back
    assert rows[("ECC_DBE", "replace")].capacity_back_p50_s == 30.0  # the spare in service
    assert rows[("XID_94", "none")].job_back_p50_s is None
    assert [(g.rung, g.gated, g.passed) for g in view.gates] == [
        ("reboot", 2, 1),
        ("replace", 1, 1),
    ]
    # Out of service: a 360 s, b 600 s (failed: to its close), c 30 s, the open one 1 h.
    assert view.node_hours_out == pytest.approx((360 + 600 + 30 + 3600) / 3600, abs=0.01)
    assert view.gpu_hours_lost == pytest.approx((360 + 600 + 30 + 3600) / 3600 * 8, abs=0.01)
    hours = (view.end - view.start).total_seconds() / 3600
    assert view.availability == pytest.approx(1 - view.node_hours_out / (10 * hours), abs=1e-4)
    assert view.job_hours_waiting == pytest.approx(2 * (5 + 10 + 4) / 3600, abs=1e-3)
    with pytest.raises(ValueError, match="range"):
        fleet.figures([], span="2w", now=NOW, nodes=1)


@pytest_asyncio.fixture
async def http() -> AsyncIterator[tuple[httpx.AsyncClient, FleetSource]]:
    app, source = fleet_app(256)
    source.add_history(days=10, per_day=6)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://c.test", headers=AUTH) as c:
        yield c, source
    await app.state.console.shared.aclose()


async def test_the_fleet_page_and_its_json(http: tuple[httpx.AsyncClient, FleetSource]) -> None:
    c, source = http
    week = (await c.get("/ui/api/fleet")).json()
    assert week["range"] == "7d" and week["nodes"] == 256 and len(week["days"]) == 7
    start = datetime.fromisoformat(week["start"])
    want = [s for s in [*source.open.values(), *source.closed] if s.request.opened_at >= start]
    assert week["incidents"] == len(want) > 0
    assert sum(sum(v) for v in week["per_day"].values()) == len(want)
    assert {g["rung"] for g in week["gates"]} == {"reboot", "reset", "replace"}
    assert 0 < week["availability"] < 1
    month = (await c.get("/ui/api/fleet?range=30d")).json()
    assert month["incidents"] == len(source.open) + len(source.closed)
    page = await c.get("/ui/fleet?range=30d")
    assert page.status_code == 200
    for part in ('id="fleet-per-day"', 'id="fleet-recovery"', 'id="fleet-gates"',
                 'id="kpi-availability"', 'aria-current="page">30 days'):  # fmt: skip
        assert part in page.text
    bad = await c.get("/ui/api/fleet?range=1y")
    assert bad.status_code == 400 and "range: one of 1d, 7d, 30d" in bad.json()["detail"]
    assert (await c.get("/ui/fleet?range=1y")).status_code == 400
