"""Systemic incidents in the web console (clients/console/systemic.py), over HTTP in
process, with the fake source of tests/console/test_console.py holding a systemic incident
of leaf-a (docs/systemic.md).

Aspects covered:
- the fleet page lists the open systemic incidents (domain, members, drained, step,
  hand-off) with a link to each one's page, and not a closed one; none open says so; a
  failed read says "unknown", not "none open", and names the error;
- a systemic incident's page: its domain, status, hand-off, its members (node, a link to
  the member's own incident page, drained, the screen's verdict, the systemic verdict; a
  member known to the guard but not joined yet), its steps; its JSON the same facts;
  text from outside (a provider's note, a member's detail) is escaped;
- a systemic id at the incident routes redirects to its systemic page (and JSON); an
  unknown id is 404 on both; without credentials it answers 401.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest_asyncio

from autoclusters.clients.systemic_incidents import SystemicRead
from autoclusters.core.guard import GuardContext
from autoclusters.core.handoff_answer import HandoffRecord
from autoclusters.core.models import StepRecord
from autoclusters.core.systemic import SystemicMember, SystemicRequest, SystemicState
from tests.console.test_console import EVIL, T0, FakeSource, app_for, login, settings

SYSTEMIC_ID = "inc-20261130-120500-leaf-a"
CLOSED_ID = "inc-20261129-080000-leaf-b"


def systemic(
    incident_id: str = SYSTEMIC_ID, *, domain: str = "leaf-a", open_: bool = True
) -> SystemicRead:
    def at(s: int) -> datetime:
        return T0 + timedelta(minutes=5, seconds=s)

    steps = [
        StepRecord(name="opened", started_at=at(0), finished_at=at(1), outcome="ok"),
        StepRecord(name="members_drained", started_at=at(1), finished_at=at(20), outcome="ok"),
        StepRecord(name="handoff", started_at=at(21), finished_at=at(22), outcome="ok",
                   detail="ticket T-7"),
        StepRecord(name="screen_together", started_at=at(90), finished_at=at(110),
                   outcome="failed", detail="diagnostic on gpu-02"),
    ]  # fmt: skip
    members = [
        SystemicMember(node="gpu-01", incident_id="inc-20261130-120000-gpu-01", drained=True,
                       screened=True, verdict="returned"),
        SystemicMember(node="gpu-02", incident_id="inc-20261130-120000-gpu-02", drained=True,
                       screened=False, verdict="screen_failed", detail=f"IB port down {EVIL}"),
        SystemicMember(node="gpu-03"),  # known to the guard, not joined yet
    ]  # fmt: skip
    handoff = HandoffRecord(
        reason="provider_fault", summary="leaf-a down", started_at=at(21), sent_at=at(22),
        ticket="T-7", answer="fixed", answered_at=at(80), note=f"switch swapped {EVIL}",
    )  # fmt: skip
    req = SystemicRequest(
        incident_id=incident_id, cluster="c1", level="leaf", domain=domain, opened_at=at(0),
        nodes=["gpu-01", "gpu-02", "gpu-03"], guard=GuardContext(cluster="c1"),
    )  # fmt: skip
    state = SystemicState(
        request=req,
        status="open" if open_ else "resolved",
        current_step="screen_alone" if open_ else None,
        members=members,
        steps=steps,
        handoff=handoff,
    )
    return SystemicRead(
        state=state, workflow_id=f"systemic-c1-leaf-{domain}", temporal_status="running"
    )


class FailingSource(FakeSource):
    async def systemic_incidents(self) -> list[SystemicState]:
        raise RuntimeError("Temporal did not answer")


async def _client(source: FakeSource) -> AsyncIterator[httpx.AsyncClient]:
    app, _ = app_for(settings())
    app.state.console.source = source
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as http:
        yield http
    await app.state.console.shared.aclose()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    source = FakeSource()
    source.systemic_reads = [systemic(), systemic(CLOSED_ID, domain="leaf-b", open_=False)]
    async for client in _client(source):
        yield client


async def test_the_fleet_page_lists_the_open_systemic_incidents(http: httpx.AsyncClient) -> None:
    await login(http)
    page = await http.get("/ui/fleet")
    assert page.status_code == 200
    assert f'href="/ui/systemic/{SYSTEMIC_ID}"' in page.text
    assert CLOSED_ID not in page.text  # closed: not listed
    got = (await http.get("/ui/api/fleet")).json()
    [row] = got["systemic"]
    assert (row["incident_id"], row["level"], row["domain"]) == (SYSTEMIC_ID, "leaf", "leaf-a")
    assert (row["members"], row["drained"], row["current_step"]) == (3, 2, "screen_alone")
    assert row["handoff"].startswith("answered fixed")
    assert got["systemic_known"] is True


async def test_none_open_and_a_failed_read_are_told_apart() -> None:
    async for http in _client(FakeSource()):
        await login(http)
        page = await http.get("/ui/fleet")
        assert "none open" in page.text
    async for http in _client(FailingSource()):
        await login(http)
        page = await http.get("/ui/fleet")
        assert page.status_code == 200
        assert "unknown: they could not be read" in page.text and "none open" not in page.text
        assert "systemic incidents: Temporal did not answer" in page.text


async def test_a_systemic_incidents_page_shows_its_members_hand_off_and_steps(
    http: httpx.AsyncClient,
) -> None:
    await login(http)
    page = await http.get(f"/ui/systemic/{SYSTEMIC_ID}")
    assert page.status_code == 200
    text = page.text
    assert "leaf leaf-a" in text and "screen_alone" in text
    # Each member links to its own incident's page; one not joined yet says so.
    for node in ("gpu-01", "gpu-02"):
        assert f'href="/ui/incidents/inc-20261130-120000-{node}"' in text
    assert "not joined yet" in text
    assert "screen_failed" in text and "returned" in text
    assert "answered fixed" in text
    assert 'data-step="screen_together"' in text and "diagnostic on gpu-02" in text
    assert EVIL not in text and "&lt;script&gt;" in text  # the note and detail, escaped
    got = (await http.get(f"/ui/api/systemic/{SYSTEMIC_ID}")).json()
    members = {m["node"]: m for m in got["members"]}
    assert members["gpu-01"] == {
        "node": "gpu-01", "incident_id": "inc-20261130-120000-gpu-01", "drained": True,
        "screen": "passed", "verdict": "returned", "detail": "",
    }  # fmt: skip
    assert (members["gpu-02"]["screen"], members["gpu-02"]["verdict"]) == (
        "failed",
        "screen_failed",
    )
    assert members["gpu-03"]["incident_id"] == "" and not members["gpu-03"]["drained"]
    assert [s["name"] for s in got["steps"]] == [
        "opened", "members_drained", "handoff", "screen_together",
    ]  # fmt: skip
    assert got["temporal_url"].endswith("systemic-c1-leaf-leaf-a")


async def test_a_systemic_id_at_the_incident_routes_goes_to_its_page(
    http: httpx.AsyncClient,
) -> None:
    await login(http)
    page = await http.get(f"/ui/incidents/{SYSTEMIC_ID}", follow_redirects=False)
    assert (page.status_code, page.headers["location"]) == (303, f"/ui/systemic/{SYSTEMIC_ID}")
    data = await http.get(f"/ui/api/incidents/{SYSTEMIC_ID}")
    assert data.headers["location"] == f"/ui/api/systemic/{SYSTEMIC_ID}"
    for path in ("/ui/systemic/inc-20261130-000000-leaf-z", "/ui/api/systemic/nope"):
        assert (await http.get(path)).status_code == 404, path


async def test_without_credentials_the_systemic_routes_answer_401(http: httpx.AsyncClient) -> None:
    for path in (f"/ui/systemic/{SYSTEMIC_ID}", f"/ui/api/systemic/{SYSTEMIC_ID}"):
        got = await http.get(path)
        assert got.status_code == 401 and "gpu-01" not in got.text, path
