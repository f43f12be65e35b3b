"""The app `autoclusters api run` serves (clients/server.py): the API with the console
mounted on it, as `create_app` served it before the console moved out of the API's package.

- the API alone (`create_app`) has no /ui route, no console and no console headers;
- the served app has every route of the API in the API's order (the plain webhook routes
  first), then the console's, all under /ui; the console's security headers outside the
  request timer; the console's 401 answer;
- `api run` and the uvicorn factory serve that app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from temporalio.client import Client

from autoclusters.clients.api.app import create_app
from autoclusters.clients.console.routes import Console
from autoclusters.clients.console.session import NotLoggedIn
from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.server import create_server, server_from_env
from autoclusters.clients.web.settings import ApiSettings
from tests.helpers import HermeticSettings


async def _no_temporal() -> Client:
    raise RuntimeError("these tests never reach Temporal")


def _flat(routes: list[Any], prefix: str = "") -> list[tuple[str, str, tuple[str, ...]]]:
    """(kind, path, methods) of each route in matching order; an included router (FastAPI
    keeps it whole, not copied into the app's routes) by its own routes."""
    out = []
    for r in routes:
        included = getattr(r, "original_router", None)
        if included is not None:
            out += _flat(included.routes, prefix + r.include_context.prefix)
        else:
            methods = tuple(sorted(getattr(r, "methods", None) or ()))
            out.append((type(r).__name__, prefix + getattr(r, "path", ""), methods))
    return out


def _routes(app: FastAPI) -> list[tuple[str, str, tuple[str, ...]]]:
    return _flat(app.router.routes)


def _middleware(app: FastAPI) -> list[str]:
    return [getattr(m.cls, "__name__", repr(m.cls)) for m in app.user_middleware]


def _apps(**changes: Any) -> tuple[FastAPI, FastAPI]:
    s = HermeticSettings(api_inventory="static", api_nodes=["gpu-01"], **changes)
    inventory = StaticInventory(s.api_nodes)
    return (
        create_app(s, client_factory=_no_temporal, inventory=inventory),
        create_server(s, client_factory=_no_temporal, inventory=inventory),
    )


@pytest.mark.parametrize("slack", [False, True], ids=["no-slack", "slack"])
def test_the_served_app_is_the_api_then_the_console(slack: bool) -> None:
    changes: dict[str, Any] = {}
    if slack:
        changes["slack"] = {"token": "xoxb-t", "channel": "C1", "signing_secret": "s"}
    api, served = _apps(**changes)

    assert not [r for r in _routes(api) if r[1].startswith("/ui")]
    assert not hasattr(api.state, "console")
    assert NotLoggedIn not in api.exception_handlers

    routes = _routes(served)
    assert routes[: len(_routes(api))] == _routes(api)
    console_routes = routes[len(_routes(api)) :]
    assert console_routes and all(path.startswith("/ui") for _, path, _ in console_routes)
    assert routes[0][0] == "_PlainRoute"  # the webhooks still come first
    assert (("APIRoute", "/slack/interactions", ("POST",)) in routes) == slack

    assert isinstance(served.state.console, Console)
    assert served.state.api is not None
    assert NotLoggedIn in served.exception_handlers
    # Outermost first: the console's headers wrap the request timer, as before.
    assert _middleware(served) == ["_SecurityHeaders", *_middleware(api)]
    assert _middleware(api) == ["RequestTimer"]


def test_the_uvicorn_factory_and_api_run_serve_the_api_with_the_console(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from autoclusters.clients.cli.app import app

    config = tmp_path / "autoclusters.toml"
    config.write_text('api_inventory = "static"\napi_nodes = ["gpu-01"]\n')
    monkeypatch.setenv("AUTOCLUSTERS_CONFIG", str(config))
    expected = _routes(create_server(ApiSettings()))
    assert _routes(server_from_env()) == expected

    served: list[FastAPI] = []
    monkeypatch.setattr(
        "autoclusters.clients.web.quiet_server.serve", lambda app, **_: served.append(app)
    )
    result = CliRunner().invoke(app, ["api", "run", "--port", "0"])
    assert result.exit_code == 0, result.output
    [run] = served
    assert _routes(run) == expected
    assert isinstance(run.state.console, Console)
