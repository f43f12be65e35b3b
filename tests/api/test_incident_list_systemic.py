"""`GET /v1/incidents` with systemic incidents (clients/incident_listing.py): the API in
uvicorn on a loopback port, a Temporal dev server, the nodes' incidents as visibility
lists them and a real SystemicIncident whose members joined with its real `join` update
(tests/fakes/listed_incidents.py).

Aspects covered:
- one list of both kinds, each row with its `kind`; a systemic row carries its level,
  domain, state and members; `unknown` is empty when both halves were read;
- `node=` matches a systemic incident that has the node as a member, `state=` its own
  state; `limit` counts both kinds;
- a half that cannot be read is named in `unknown` (200, the other half listed), never an
  empty list; neither half readable: the read fails as a whole (while Temporal is away,
  the API's 503 of every read, tests/api/test_api.py).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.clients import incident_listing
from autoclusters.core.settings import Settings
from autoclusters.workflows.systemic_incident import SystemicIncident
from tests.api.test_api import api_server, settings_for
from tests.fakes.listed_incidents import AT, ListedNodeIncident, open_node_incident, open_systemic
from tests.helpers import (
    dev_server_env,  # noqa: F401  (this module's `env`: a dev server)
    eventually,
)

pytestmark = pytest.mark.integration  # a Temporal dev server


@pytest_asyncio.fixture(scope="module")
async def queue(env: WorkflowEnvironment) -> AsyncIterator[str]:
    name = f"list-api-{uuid.uuid4().hex[:6]}"
    workflows = [SystemicIncident, ListedNodeIncident]
    async with Worker(env.client, task_queue=name, workflows=workflows):
        yield name


@pytest_asyncio.fixture
async def cluster(
    env: WorkflowEnvironment, queue: str
) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A fresh cluster's API (its name, an HTTP client to it)."""
    settings = settings_for(env.client.service_client.config.target_host, queue)
    async with api_server(settings) as http:
        yield settings.cluster, http


async def _listing(http: httpx.AsyncClient, query: str = "") -> dict[str, Any]:
    r = await http.get(f"/v1/incidents{query}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _ids(body: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((r["kind"], r["incident_id"]) for r in body["incidents"])


async def test_systemic_incidents_beside_the_nodes_filtered_and_unknown_halves(
    env: WorkflowEnvironment,
    queue: str,
    cluster: tuple[str, httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, http = cluster
    gpu05 = await open_node_incident(env.client, queue, name, "gpu-05", "XID_79", AT)
    systemic = await open_systemic(
        env.client, queue, name, "nvlink", "nvl-a", AT,
        joined={"gpu-01": "NVLINK_DOWN", "gpu-02": "NVLINK_DOWN"}, known=[],
    )  # fmt: skip

    async def both() -> bool:
        return len((await _listing(http))["incidents"]) == 2

    await eventually(both, what="both incidents listed")  # visibility catches up
    body = await _listing(http)
    assert _ids(body) == [("node", gpu05), ("systemic", systemic)] and body["unknown"] == []
    (row,) = [r for r in body["incidents"] if r["kind"] == "systemic"]
    assert (row["level"], row["domain"], row["state"]) == ("nvlink", "nvl-a", "open")
    assert [m["node"] for m in row["members"]] == ["gpu-01", "gpu-02"]

    assert _ids(await _listing(http, "?node=gpu-02")) == [("systemic", systemic)]
    assert _ids(await _listing(http, "?node=gpu-05")) == [("node", gpu05)]
    assert _ids(await _listing(http, "?state=open")) == _ids(body)
    assert (await _listing(http, "?state=handed_off"))["incidents"] == []
    assert len((await _listing(http, "?limit=1"))["incidents"]) == 1

    async def away(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("visibility store away")

    monkeypatch.setattr(incident_listing, "list_systemic", away)
    partial = await _listing(http)
    assert _ids(partial) == [("node", gpu05)]
    assert [u["kind"] for u in partial["unknown"]] == ["systemic"]
    assert "visibility store away" in partial["unknown"][0]["reason"]

    monkeypatch.setattr(incident_listing, "list_incidents", away)
    with pytest.raises(RuntimeError, match="visibility store away"):
        await incident_listing.list_all_incidents(env.client, Settings(cluster=name), limit=10)
