"""The fleet page (clients/console/fleet.py): figures read off the incidents' timelines.

- incidents per day by fault, counted on the day they opened, within the range only;
- jobs back and capacity back by fault and rung, as the worker's metrics measure them;
- the share of repairs on each rung that passed their health gate;
- node availability and the work lost: node-hours out of service (opened -> capacity back,
  an open incident to the range's end), GPU-hours, job-hours waiting for the requeue;
- over HTTP: the page and its JSON, the range asked, a bad range refused naming it;
- the repair ladder from the incidents' histories (the figures incidents open with), each
  rung the live policy skips marked with the reason an incident would give; a ladder that
  cannot be read is named in the errors, and the rest of the page still shows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import pytest_asyncio

from autoclusters.clients.console import fleet
from autoclusters.clients.console.ladder import ladder_view
from autoclusters.core.ladder_figures import LadderFigures, RungFigures
from autoclusters.core.models import IncidentRequest, IncidentState
from autoclusters.core.policy import Policy
from tests.console.test_console_shared_read import AUTH, fleet_app
from tests.fakes.fleet import FleetSource, timeline

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


def test_the_ladder_marks_the_rungs_the_policy_skips() -> None:
    figures = LadderFigures(as_of=NOW, incidents=30, rows=[
        RungFigures(fault="XID_48", rung="reboot", attempts=2, successes=0),
        RungFigures(fault="XID_79", rung="reboot", attempts=14, successes=1),
        RungFigures(fault="XID_79", rung="replace", attempts=6, successes=1,
                    median_capacity_s=900.0),
    ])  # fmt: skip
    skipping = ladder_view(figures, Policy(skip_rung_below=0.2, min_samples=10), 90)
    rows = {(r.fault, r.rung): r for r in skipping.rows}
    assert rows[("XID_79", "reboot")].skipped == (
        "reboot fixed XID_79 in 1 of 14 cases: going to replace"
    )
    assert rows[("XID_48", "reboot")].skipped == ""  # 2 tries: under min_samples
    assert rows[("XID_79", "replace")].skipped == ""  # the top rung is never skipped
    assert rows[("XID_79", "replace")].success_rate == pytest.approx(1 / 6)
    plain = ladder_view(figures, Policy(), 90)
    assert [r.skipped for r in plain.rows] == ["", "", ""]
    assert (plain.incidents, plain.history_days, plain.skip_rung_below) == (30, 90, 0.0)


async def test_the_fleet_page_shows_the_ladder_and_names_a_ladder_it_cannot_read() -> None:
    app, source = fleet_app(64)
    source.add_history(days=10, per_day=6)
    console = app.state.console
    console.policy = lambda: Policy(skip_rung_below=0.95, min_samples=3)
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://c.test", headers=AUTH
        ) as c:
            body = (await c.get("/ui/api/fleet")).json()
            assert isinstance(source.ladder_figures, LadderFigures)
            want = source.ladder_figures.rows
            got = body["ladder"]["rows"]
            assert [(r["fault"], r["rung"], r["attempts"], r["successes"]) for r in got] == [
                (r.fault, r.rung, r.attempts, r.successes) for r in want
            ]
            skipped = [r for r in got if r["skipped"]]
            # Rungs below the top that held in under 95 % of at least 3 tries, and only those.
            assert skipped and all(
                r["rung"] != "replace" and r["attempts"] >= 3
                and r["successes"] / r["attempts"] < 0.95
                for r in skipped
            )  # fmt: skip
            page = await c.get("/ui/fleet")
            assert 'id="fleet-ladder"' in page.text
            assert f"skipped: {skipped[0]['skipped']}" in page.text

            source.ladder_figures = RuntimeError("Temporal is away")
            body = (await c.get("/ui/api/fleet")).json()
            assert body["ladder"] is None and body["incidents"] > 0
            assert "repair ladder: Temporal is away" in body["errors"]
            page = await c.get("/ui/fleet")
            assert page.status_code == 200 and 'id="fleet-ladder"' not in page.text
            assert "repair ladder: Temporal is away" in page.text
    finally:
        await console.shared.aclose()
