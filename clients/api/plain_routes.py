"""The alert webhooks served as plain Starlette routes, ahead of FastAPI's.

Their endpoints take the bare Request and answer a Response (the body is parsed by hand,
after the token check), so FastAPI's per-request machinery (dependency solving, its
endpoint wrapper) does nothing for them but costs a quarter of the CPU of an alert. The
FastAPI routes stay registered behind these, for the OpenAPI document; requests never
reach them. Exception handlers are the app's, as for any route.
"""

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match, Route
from starlette.types import Scope


class _PlainRoute(Route):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match != Match.NONE:
            child["route"] = self  # as FastAPI's routes do: the request timer's label
        return match, child


def serve_plainly(app: FastAPI, routers: list[APIRouter], paths: set[str]) -> None:
    """Put a plain route in front of each POST route of `routers` at `paths`, with its
    endpoint. The routers' own routes, not the app's: an included router's routes are not
    in `app.router.routes`."""
    plain = []
    for route in (route for router in routers for route in router.routes):
        if isinstance(route, APIRoute) and route.path in paths and route.methods == {"POST"}:
            plain.append(_PlainRoute(route.path, route.endpoint, methods=["POST"]))
    missing = paths - {r.path for r in plain}
    assert not missing, f"no POST route at {sorted(missing)}"
    app.router.routes[:0] = plain
