"""An emulator's routes, analysed by FastAPI once per process; its handlers, once per app.

FastAPI analyses every route when it is added (the parameters, the body model, a response
model from the return annotation): ~0.7 ms a route. The Crusoe emulator's router factories
close over one emulator's engine, so each `create_app` added all of its routes again: the
unit lane, which builds an emulator per test, spent ~5 s of CPU doing so (~100 apps).

Here a factory writes its endpoints into a `Handlers` (it stands in for the `APIRouter`:
`@router.get(path)` and so on), closures over that app's own state, as before. A
`RouteTable` turns the first app's endpoints into FastAPI routes, once per process: each
route's endpoint has the signature of the handler it stands for (so FastAPI parses the same
parameters and bodies and answers with the same response model) and calls the handler of
the app that got the request (`request.app.state.handlers`). Every app gets the same route
objects, which nothing changes after they are built; what each app keeps (its engine, its
faults, its handlers) is its own.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.routing import BaseRoute

__all__ = ["Handlers", "RouteTable"]

Endpoint = Callable[..., Awaitable[Any]]
_REQUEST = "route_table_request__"  # a name no handler uses for a parameter of its own


class Handlers:
    """Stands in for an `APIRouter` in a router factory: records the endpoints in order."""

    def __init__(self) -> None:
        self.endpoints: list[tuple[str, str, Endpoint]] = []
        self._prefix = ""

    def under(self, prefix: str) -> Handlers:
        """The same record, with `prefix` before the paths added from here on."""
        self._prefix = prefix
        return self

    def _add(self, method: str, path: str) -> Callable[[Endpoint], Endpoint]:
        def record(endpoint: Endpoint) -> Endpoint:
            if not inspect.iscoroutinefunction(endpoint):
                raise TypeError(f"{endpoint.__name__}: an emulator's endpoints are async")
            self.endpoints.append((method, self._prefix + path, endpoint))
            return endpoint

        return record

    def get(self, path: str) -> Callable[[Endpoint], Endpoint]:
        return self._add("GET", path)

    def post(self, path: str) -> Callable[[Endpoint], Endpoint]:
        return self._add("POST", path)

    def put(self, path: str) -> Callable[[Endpoint], Endpoint]:
        return self._add("PUT", path)

    def patch(self, path: str) -> Callable[[Endpoint], Endpoint]:
        return self._add("PATCH", path)

    def delete(self, path: str) -> Callable[[Endpoint], Endpoint]:
        return self._add("DELETE", path)


class RouteTable:
    """One kind of app's routes, built from the first app's `Handlers`, kept for the process."""

    def __init__(self) -> None:
        self._shape: list[tuple[str, str]] | None = None
        self._routes: list[BaseRoute] = []

    def install(self, app: FastAPI, handlers: Handlers) -> None:
        """Give `app` the table's routes (in the order recorded) and `handlers` to answer them."""
        shape = [(method, path) for method, path, _ in handlers.endpoints]
        if self._shape is None:
            router = APIRouter()
            for i, (method, path, endpoint) in enumerate(handlers.endpoints):
                router.add_api_route(
                    path, _stand_in(i, endpoint), methods=[method], name=endpoint.__name__
                )
            self._routes, self._shape = list(router.routes), shape
        elif shape != self._shape:
            raise RuntimeError("a router factory recorded other routes than the first time")
        app.state.handlers = [endpoint for _, _, endpoint in handlers.endpoints]
        app.router.routes.extend(self._routes)


def _stand_in(index: int, handler: Endpoint) -> Endpoint:
    """An endpoint with `handler`'s parameters (and the request, when it has none) that
    calls the handler at `index` of the app that got the request."""
    signature = inspect.signature(handler, eval_str=True)
    params = list(signature.parameters.values())
    named = next((p.name for p in params if p.annotation is Request), None)
    if named is None:
        params.append(
            inspect.Parameter(_REQUEST, inspect.Parameter.KEYWORD_ONLY, annotation=Request)
        )

    async def endpoint(**kwargs: Any) -> Any:
        request: Request = kwargs[named] if named is not None else kwargs.pop(_REQUEST)
        return await request.app.state.handlers[index](**kwargs)

    endpoint.__name__ = endpoint.__qualname__ = handler.__name__
    endpoint.__doc__ = handler.__doc__
    endpoint.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    return endpoint
