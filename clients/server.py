"""The app `autoclusters api run` serves: the HTTP API (clients/api) with the web console
(clients/console) under /ui.

The assembly of the two lives here, above both, so that the API and the console stay
independent of each other (.importlinter): the console reads the API's Temporal connection,
bearer tokens and policy through what `create_app` left in `app.state.api`, and what both
need of the settings and the token check is in clients/web.
"""

from __future__ import annotations

from fastapi import FastAPI

from autoclusters.clients import console
from autoclusters.clients.api.app import create_app
from autoclusters.clients.api.state import ApiState
from autoclusters.clients.api.temporal_gate import ClientFactory
from autoclusters.clients.inventory import NodeInventory
from autoclusters.clients.web.settings import ApiSettings


def create_server(
    settings: ApiSettings,
    client_factory: ClientFactory | None = None,
    inventory: NodeInventory | None = None,
) -> FastAPI:
    """The API for one cluster (`create_app`, which says what the arguments are) with the
    console mounted on it: its routes after the API's, its 401 answer, its headers."""
    app = create_app(settings, client_factory, inventory)
    api: ApiState = app.state.api
    console.mount(
        app, settings=settings, auth=api.auth, client=api.gate.client, policy=api.policies.current
    )
    return app


def server_from_env() -> FastAPI:
    """For `uvicorn --factory autoclusters.clients.server:server_from_env`: settings from
    the environment and autoclusters.toml, as every entry point reads them."""
    return create_server(ApiSettings())
