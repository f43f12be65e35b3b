"""The sandbox's ticket desk plays the provider (sandbox/crusoe/ticket_desk.py, docs/handoff.md):

- its answer reaches the API signed as the API verifies (the API gets past its 401 and
  looks the incident up), carries the ticket it opened, and is recorded on the ticket;
- a ticket that names no answer URL, and an incident with no ticket, send nothing;
- `sandbox ticket answer` takes exactly one of --fixed, --replaced, --declined.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
import typer
from pydantic import SecretStr
from typer.testing import CliRunner

from autoclusters.clients import incidents
from autoclusters.clients.api.app import create_app
from autoclusters.clients.inventory import StaticInventory
from autoclusters.core.handoff import IDEMPOTENCY_HEADER, signed_headers
from autoclusters.core.settings_groups import HandoffSettings
from autoclusters.sandbox import cli as sandbox_cli
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.sandbox.crusoe.ticket_desk import Desk
from autoclusters.sandbox.crusoe.ticket_desk import create_app as desk_app
from tests.activities.test_handoff_signing import SECRET, _request
from tests.helpers import HermeticSettings

INCIDENT = "inc-20260105-030000-gpu-01"


async def _hand_off(http: httpx.AsyncClient, answer_url: str) -> None:
    body = _request(INCIDENT).model_copy(update={"answer_url": answer_url}).body()
    headers = {**signed_headers(SECRET, int(time.time()), body), IDEMPOTENCY_HEADER: INCIDENT}
    r = await http.post("/tickets", content=body, headers=headers)
    assert r.status_code == 200, r.text


async def test_the_desks_answer_is_signed_as_the_api_verifies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    async def nowhere(_client: Any, _settings: Any, incident_id: str) -> Any:
        asked.append(incident_id)
        raise incidents.IncidentNotFound(f"no incident {incident_id} in cluster c1")

    monkeypatch.setattr(incidents, "find_incident", nowhere)
    settings = HermeticSettings(
        cluster="c1", api_inventory="static", handoff=HandoffSettings(secret=SecretStr(SECRET))
    )

    async def temporal() -> Any:
        return object()  # never used: the look-up above answers first

    api = create_app(settings, temporal, StaticInventory(["gpu-01"]))
    desk = Desk(SECRET)
    with EmulatorServer(api) as server:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=desk_app(desk)), base_url="http://desk"
        ) as http:
            await _hand_off(http, f"{server.url}/v1/handoffs/{INCIDENT}/answer")
            r = await http.post(
                f"/_desk/tickets/{INCIDENT}/answer", json={"answer": "fixed", "note": "ok"}
            )
    said = r.json()
    # Past the signature (a 401 otherwise): the API looked the incident up.
    assert said["status"] == 404, said
    assert asked == [INCIDENT]
    assert desk.tickets[INCIDENT].answers == [{"answer": "fixed", "status": 404}]


async def test_the_desk_sends_nothing_without_a_ticket_or_an_answer_url() -> None:
    desk = Desk(SECRET)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=desk_app(desk)), base_url="http://desk"
    ) as http:
        r = await http.post(f"/_desk/tickets/{INCIDENT}/answer", json={"answer": "fixed"})
        assert r.status_code == 404
        await _hand_off(http, "")  # a worker without api_public_url names none
        r = await http.post(f"/_desk/tickets/{INCIDENT}/answer", json={"answer": "fixed"})
        assert r.status_code == 409 and "answer_url" in r.json()["error"]
        r = await http.post(f"/_desk/tickets/{INCIDENT}/answer", json={"answer": "maybe"})
        assert r.status_code == 422
    assert desk.tickets[INCIDENT].answers == []


@pytest.mark.parametrize("flags", [[], ["--fixed", "--declined"]], ids=["none", "two"])
def test_ticket_answer_takes_exactly_one_answer(flags: list[str]) -> None:
    cli = typer.Typer()
    sandbox_cli.register(cli)
    r = CliRunner().invoke(cli, ["sandbox", "ticket", "answer", INCIDENT, *flags])
    assert r.exit_code == 2, r.output
    assert "exactly one of --fixed, --replaced, --declined" in r.output
