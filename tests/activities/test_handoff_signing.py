"""The hand-off's signing and its two ends without a server (docs/handoff.md):

- a signature is HMAC-SHA256 over `v1:<timestamp>:<raw body>` as the docs write it; a
  tampered body, another secret, a timestamp outside the window either way, missing or
  malformed headers, and no secret at all are refused, each saying why;
- the webhook client signs each try, sends the idempotency key, reads the receiver's
  ticket, and tells a busy receiver (retry) from a refusal (no retry);
- the activity without a secret fails at once, not retried;
- the policy refuses a hand-off enabled without a URL;
- the API's answer route: 401 before anything else, 422 naming the field, 404 unknown
  incident; the sandbox's desk: 401, 400 without a key, one ticket per key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.handoff import HandoffActivities
from autoclusters.clients import incidents
from autoclusters.clients.api.app import create_app
from autoclusters.clients.inventory import StaticInventory
from autoclusters.core.handoff import (
    ANSWER_PATH,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    WINDOW_S,
    HandoffCall,
    HandoffRequest,
    Machine,
    SignatureRefused,
    sign,
    signed_headers,
    verify,
)
from autoclusters.core.policy import HandoffPolicy, PolicyError, parse_policy
from autoclusters.core.settings_groups import HandoffSettings
from autoclusters.integrations.handoff import HandoffClient, HandoffRefused, HandoffUnavailable
from autoclusters.sandbox.crusoe.ticket_desk import Desk
from autoclusters.sandbox.crusoe.ticket_desk import create_app as desk_app
from tests.helpers import HermeticSettings

SECRET = "a-shared-secret-of-enough-length-0123"
NOW = 1_800_000_000
BODY = b'{"answer": "fixed"}'


def test_the_signature_is_hmac_sha256_over_version_timestamp_and_body() -> None:
    want = hmac.new(SECRET.encode(), b"v1:1800000000:" + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, NOW, BODY) == f"v1={want}"
    verify(SECRET, str(NOW), f"v1={want}", BODY, now=NOW + WINDOW_S)  # at the edge: fine


@pytest.mark.parametrize(
    ("secret", "ts", "sig", "body", "why"),
    [
        (SECRET, str(NOW), sign(SECRET, NOW, BODY), b'{"answer": "declined"}', "does not match"),
        (SECRET, str(NOW), sign("another-secret-of-enough-length-000", NOW, BODY), BODY,
         "does not match"),
        (SECRET, str(NOW - WINDOW_S - 1), sign(SECRET, NOW - WINDOW_S - 1, BODY), BODY,
         "from now"),
        (SECRET, str(NOW + WINDOW_S + 1), sign(SECRET, NOW + WINDOW_S + 1, BODY), BODY,
         "from now"),
        (SECRET, None, sign(SECRET, NOW, BODY), BODY, "missing"),
        (SECRET, str(NOW), None, BODY, "missing"),
        (SECRET, "yesterday", sign(SECRET, NOW, BODY), BODY, "not unix seconds"),
        (None, str(NOW), sign(SECRET, NOW, BODY), BODY, "no hand-off secret"),
    ],
    ids=["tampered", "other-secret", "stale", "future", "no-ts", "no-sig", "bad-ts", "no-secret"],
)  # fmt: skip
def test_a_signature_that_does_not_hold_is_refused_saying_why(
    secret: str | None, ts: str | None, sig: str | None, body: bytes, why: str
) -> None:
    with pytest.raises(SignatureRefused, match=why):
        verify(secret, ts, sig, body, now=NOW)


def _request(incident_id: str = "inc-20260105-030000-gpu-01") -> HandoffRequest:
    at = datetime(2026, 1, 5, 3, 0, tzinfo=UTC)
    return HandoffRequest(
        idempotency_key=incident_id, incident_id=incident_id, cluster="c1", node="gpu-01",
        fault="XID_79", reason="health_gate_failed", summary="the ladder ended",
        opened_at=at, handed_off_at=at, machine=Machine(node="gpu-01", vm_id="vm-1"),
    )  # fmt: skip


async def test_the_client_signs_each_try_and_reads_the_ticket() -> None:
    seen: list[httpx.Request] = []
    clock = iter([NOW, NOW + 60, NOW + 60])

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append(r)
        if len(seen) == 1:
            return httpx.Response(503, text="busy")
        return httpx.Response(200, json={"ticket": "TKT-7", "duplicate": False})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = HandoffClient(http, SECRET, clock=lambda: next(clock))
    body = _request().body()
    with pytest.raises(HandoffUnavailable, match="503"):
        await client.deliver("http://desk/tickets", "inc-1", body)
    sent = await client.deliver("http://desk/tickets", "inc-1", body)
    assert (sent.ticket, sent.duplicate, sent.status) == ("TKT-7", False, 200)
    first, second = seen
    assert first.content == second.content == body  # the same bytes on every try
    assert [r.headers[IDEMPOTENCY_HEADER] for r in seen] == ["inc-1", "inc-1"]
    assert [r.headers[TIMESTAMP_HEADER] for r in seen] == [str(NOW), str(NOW + 60)]
    for r, at in zip(seen, (NOW, NOW + 60), strict=True):
        verify(SECRET, r.headers[TIMESTAMP_HEADER], r.headers[SIGNATURE_HEADER], r.content, at)


async def test_a_refusal_is_not_a_reason_to_try_again() -> None:
    http = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(401)))
    with pytest.raises(HandoffRefused, match="401"):
        await HandoffClient(http, SECRET).deliver("http://desk/tickets", "k", b"{}")


async def test_a_worker_without_a_secret_fails_the_send_at_once() -> None:
    call = HandoffCall(url="http://desk/tickets", request=_request())
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(HandoffActivities(None).send_handoff, call)
    assert caught.value.type == "HandoffNotConfigured" and caught.value.non_retryable


def test_a_hand_off_enabled_without_a_url_is_refused_at_load() -> None:
    with pytest.raises(PolicyError, match="handoff.url is required"):
        parse_policy("handoff:\n  enabled: true\n")
    assert HandoffPolicy().enabled is False  # off by default: old runs unchanged
    p = parse_policy("handoff:\n  enabled: true\n  url: https://tickets.example/hooks\n")
    assert p.handoff.hands_off("IB_LINK_DOWN") is False  # only the faults it names


# --- the API's answer route ---------------------------------------------------------------


def _api(secret: str | None = SECRET, temporal: object | None = None) -> httpx.AsyncClient:
    """The API; `temporal`: what it gets for a Temporal client (None: a refused answer
    must never ask for one)."""
    s = HermeticSettings(
        cluster="c1",
        api_inventory="static",
        handoff=HandoffSettings(secret=None if secret is None else SecretStr(secret)),
    )

    async def no_temporal() -> Any:
        if temporal is None:
            raise AssertionError("a refused answer never reaches Temporal")
        return temporal

    app = create_app(s, no_temporal, StaticInventory(["gpu-01"]))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")


def _post(http: httpx.AsyncClient, incident_id: str, body: bytes, **headers: str) -> Any:
    return http.post(ANSWER_PATH.format(incident_id=incident_id), content=body, headers=headers)


async def test_the_answer_route_refuses_a_bad_signature_before_reading_the_body() -> None:
    body = b"not json at all"
    async with _api() as http:
        r = await _post(http, "inc-20260105-030000-gpu-01", body)
        assert r.status_code == 401 and "missing" in r.json()["detail"]
        forged = signed_headers("another-secret-of-enough-length-000", int(time.time()), body)
        r = await _post(http, "inc-20260105-030000-gpu-01", body, **forged)
        assert r.status_code == 401 and "does not match" in r.json()["detail"]
    async with _api(secret=None) as http:  # no secret on the API: nothing verifies
        r = await _post(http, "x", BODY, **signed_headers(SECRET, int(time.time()), BODY))
        assert r.status_code == 401 and "no hand-off secret" in r.json()["detail"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"answer": "maybe"}, "answer"),
        ({}, "answer"),
        ({"answer": "fixed", "note": "x" * 2001}, "note"),
        ({"answer": "fixed", "approver": "me"}, "approver"),
    ],
    ids=["bad-answer", "no-answer", "long-note", "unknown-field"],
)
async def test_a_malformed_answer_is_422_naming_the_field(body: dict[str, Any], field: str) -> None:
    raw = json.dumps(body).encode()
    async with _api() as http:
        r = await _post(http, "inc-20260105-030000-gpu-01", raw, **_signed(raw))
    assert r.status_code == 422, r.text
    assert r.json()["fields"] == [field]


async def test_an_answer_for_no_such_incident_is_404(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    async def nowhere(_client: Any, _settings: Any, incident_id: str) -> Any:
        asked.append(incident_id)
        raise incidents.IncidentNotFound(f"no incident {incident_id} in cluster c1")

    monkeypatch.setattr(incidents, "find_incident", nowhere)
    raw = b'{"answer": "fixed"}'
    async with _api(temporal=object()) as http:
        r = await _post(http, "not-an-incident", raw, **_signed(raw))
        assert r.status_code == 404 and "not an incident id" in r.json()["detail"]
        assert asked == []  # refused before Temporal
        r = await _post(http, "inc-20260105-030000-gpu-09", raw, **_signed(raw))
    assert r.status_code == 404 and "no incident inc-20260105-030000-gpu-09" in r.text
    assert asked == ["inc-20260105-030000-gpu-09"]


def _signed(body: bytes) -> dict[str, str]:
    return signed_headers(SECRET, int(time.time()), body)


# --- the sandbox's ticket desk ---------------------------------------------------------------


async def test_the_desk_verifies_and_opens_one_ticket_per_key() -> None:
    desk = Desk(SECRET)
    body = _request().body()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=desk_app(desk)), base_url="http://desk"
    ) as http:
        r = await http.post("/tickets", content=body, headers=_signed(body))
        assert r.status_code == 400  # no idempotency key
        keyed = {**_signed(body), IDEMPOTENCY_HEADER: "inc-1"}
        bad = {**keyed, SIGNATURE_HEADER: sign(SECRET, int(time.time()), b"other")}
        r = await http.post("/tickets", content=body, headers=bad)
        assert r.status_code == 401
        first = await http.post("/tickets", content=body, headers=keyed)
        again = await http.post("/tickets", content=body, headers=keyed)
    assert first.json() == {"ticket": "TKT-0001", "duplicate": False}
    assert again.json() == {"ticket": "TKT-0001", "duplicate": True}
    assert [(t.key, t.deliveries) for t in desk.tickets.values()] == [("inc-1", 2)]
    assert desk.refused == 1
