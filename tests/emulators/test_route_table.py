"""The Crusoe emulator's routes are built once per process (sandbox/crusoe/route_table.py):
every app answers with its own state, parses parameters and bodies as its handlers declare
them, and a factory that records other routes than the first time is refused."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from autoclusters.sandbox.crusoe.emulator import create_app
from autoclusters.sandbox.crusoe.route_table import Handlers, RouteTable
from autoclusters.sandbox.crusoe.world import EmulatorConfig


def _app(project: str) -> FastAPI:
    return create_app(
        EmulatorConfig(access_key_id="k", secret_key=SecretStr("s"), project_id=project)
    )


def _client(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://emulator")


async def test_two_apps_share_their_routes_and_nothing_else() -> None:
    a, b = _app("p-a"), _app("p-b")
    assert [id(r) for r in a.routes] == [id(r) for r in b.routes]
    async with _client(a) as ca, _client(b) as cb:
        seeded = await ca.post("/_emulator/vms", json={"vms": [{"name": "gpu-1"}]})
        assert seeded.status_code == 200, seeded.text
        assert [vm["project_id"] for vm in seeded.json()["vms"]] == ["p-a"]
        state_a = (await ca.get("/_emulator/state")).json()
        assert [vm["name"] for vm in state_a["vms"].values()] == ["gpu-1"]
        assert (await cb.get("/_emulator/state")).json()["vms"] == {}
        # A body model and a query parameter, parsed as the handler declares them.
        quota = await ca.post("/_emulator/quota", json={"max_vms": 3})
        assert quota.json() == {"max_vms": 3}
        assert (await cb.post("/_emulator/quota", json={"max_vms": -1})).status_code == 400
        bad_since = await cb.get("/_emulator/operations", params={"since": "nope"})
        assert bad_since.status_code == 400
        none = await ca.get("/_emulator/operations", params={"vm_name": "x"})
        assert none.json() == {"operations": []}


def test_a_factory_that_changes_its_routes_is_refused() -> None:
    table = RouteTable()

    def factory(extra: bool) -> Handlers:
        router = Handlers()

        @router.get("/one")
        async def one() -> dict[str, int]:
            return {"one": 1}

        if extra:

            @router.get("/two")
            async def two() -> dict[str, int]:
                return {"two": 2}

        return router

    table.install(FastAPI(), factory(False))
    with pytest.raises(RuntimeError, match="other routes"):
        table.install(FastAPI(), factory(True))
