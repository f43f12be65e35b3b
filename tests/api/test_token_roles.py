"""Each API token is a role (clients/web/tokens.py) and opens only its role's routes: every
token against every route, through the real app (API and console), with no Temporal behind
it — a refusal must come before anything is asked of it.

- a route outside the token's role answers 403 (401 on the console, which has no 403 page)
  and starts nothing; inside it the token passes authentication (whatever comes next);
- two tokens of one role are valid at once (rotation); an operator's token is configured
  as its SHA-256 only, and its grant's name is who decides;
- a bare token under a name that is no role is a settings error naming the entry.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from temporalio.client import Client

from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.server import create_server
from autoclusters.clients.web.auth import BearerAuth, Caller
from autoclusters.clients.web.tokens import ROLES, ROUTES
from tests.helpers import HermeticSettings

TOKENS = {
    "agent": "agent-token-0123456789",
    "alertmanager": "alertmanager-token-0123",
    "reader": "reader-token-0123456789",
    "alice": "alices-own-token-0123456",
}
ROLE_OF = {
    "agent": "agent",
    "alertmanager": "alertmanager",
    "reader": "reader",
    "alice": "operator",
}

# (method, path, route group); bodies are irrelevant: authorization comes first.
ROUTES_TRIED = [
    ("POST", "/v1/alerts/alertmanager", "alerts"),
    ("POST", "/v1/alerts/sharing", "alerts"),
    ("POST", "/v1/reports", "reports"),
    ("POST", "/v1/health-snapshots", "reports"),
    ("POST", "/v1/incidents/inc-20261205-000000-gpu-01/decisions", "decide"),
    ("POST", "/v1/breaker/reset", "decide"),
    ("POST", "/v1/moves/c-move-1/decisions", "decide"),
    ("GET", "/v1/incidents", "read"),
    ("GET", "/v1/incidents/inc-20261205-000000-gpu-01", "read"),
    ("GET", "/metrics", "metrics"),
    ("GET", "/ui/api/incidents", "console"),
]


def settings(**changes: Any) -> HermeticSettings:
    fields: dict[str, Any] = {
        "cluster": "c",
        "api_tokens": {
            "agent": TOKENS["agent"],
            "alertmanager": TOKENS["alertmanager"],
            "reader": {"role": "reader", "token": TOKENS["reader"]},
        },
        "api_operators": {"alice": hashlib.sha256(TOKENS["alice"].encode()).hexdigest()},
        "api_auth_reads": True,
        "api_host": "0.0.0.0",  # not loopback: /metrics and the console ask for a token
        "api_inventory": "static",
        "api_nodes": ["gpu-01"],
    }
    return HermeticSettings(**{**fields, **changes})


@pytest.fixture
async def http() -> Any:
    asked: list[str] = []

    async def no_temporal() -> Client:
        asked.append("temporal")
        raise RuntimeError("no Temporal in this test")

    s = settings()
    app = create_server(s, no_temporal, StaticInventory(s.api_nodes))
    transport = httpx.ASGITransport(app=app, client=("192.0.2.7", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
        client.asked = asked  # type: ignore[attr-defined]
        yield client


@pytest.mark.parametrize("caller", list(TOKENS))
@pytest.mark.parametrize(("method", "path", "route"), ROUTES_TRIED)
async def test_each_token_opens_its_roles_routes_and_no_other(
    http: Any, caller: str, method: str, path: str, route: str
) -> None:
    headers = {"Authorization": f"Bearer {TOKENS[caller]}"}
    r = await http.request(method, path, headers=headers, content=b"{}")
    allowed = ROLE_OF[caller] in ROUTES[route]  # type: ignore[index]
    if allowed:
        assert r.status_code not in (401, 403), (caller, path, r.text)
    else:
        assert r.status_code == (401 if route == "console" else 403), (caller, path, r.text)
        assert http.asked == [], "a refused call must ask nothing of Temporal"
        if route != "console":
            assert f"a {ROLE_OF[caller]} token may not call this" in r.json()["detail"]


@pytest.mark.parametrize(("method", "path", "route"), ROUTES_TRIED)
async def test_without_a_token_every_route_but_health_is_401(
    http: Any, method: str, path: str, route: str
) -> None:
    r = await http.request(method, path, content=b"{}")
    assert r.status_code == 401, (path, r.text)
    assert (await http.get("/healthz")).status_code == 200


def test_every_role_opens_something_and_only_the_operator_decides() -> None:
    assert {role for roles in ROUTES.values() for role in roles} == set(ROLES)
    assert ROUTES["decide"] == {"operator"}
    assert set(ROUTES_TRIED_GROUPS) == set(ROUTES)


ROUTES_TRIED_GROUPS = {route for _, _, route in ROUTES_TRIED}


def test_two_tokens_of_a_role_are_valid_at_once_and_a_person_is_their_grant() -> None:
    s = settings(
        api_tokens={
            "alertmanager": TOKENS["alertmanager"],
            "alertmanager-next": {"role": "alertmanager", "token": "the-next-one-0123456789"},
        }
    )
    auth = BearerAuth(s)
    assert auth.caller(f"Bearer {TOKENS['alertmanager']}").role == "alertmanager"
    assert auth.caller("Bearer the-next-one-0123456789") == Caller(
        "alertmanager-next", "alertmanager"
    )
    assert auth.allowed(f"Bearer {TOKENS['alice']}", "decide") == Caller("alice", "operator")
    # The settings hold no person's token, only its digest.
    assert TOKENS["alice"] not in s.model_dump_json()


@pytest.mark.parametrize(
    ("tokens", "said"),
    [
        ({"ops": "a-token-long-enough-0"}, "api_tokens.ops: a bare token needs a role's name"),
        ({"agent": "short"}, "at least 16 characters"),
        ({"x": {"role": "admin", "token": "a-token-long-enough-0"}}, "role"),
        ({"x": {"role": "operator", "sha256": "not-hex"}}, "64 lowercase hex"),
        ({"x": {"role": "reader"}}, "exactly one of token and sha256"),
    ],
)
def test_a_token_without_a_clear_role_is_a_settings_error(
    tokens: dict[str, Any], said: str
) -> None:
    with pytest.raises(ValidationError, match=said):
        HermeticSettings(api_tokens=tokens)
