"""`autoclusters incident list` with systemic incidents beside the nodes' ones
(clients/incident_listing.py), through the Typer app against a real Temporal dev server
(on its own thread and event loop): the nodes' incidents as visibility lists them, and
real SystemicIncident workflows whose members joined with the real `join` update
(tests/fakes/listed_incidents.py).

Aspects covered:
- the list shows both kinds; a systemic row names its level, domain and members and its
  members' faults; `--json` carries `kind`, the members (drained or not) and the state;
- the filters on systemic rows: `--node` matches a systemic incident that has the node as
  a member (and not one without it), `--state` its own state, `--fault` its members';
- a systemic incident whose status query no worker answers is listed with its state and
  members unknown, even under a node filter (unknown is no "no match");
- a half that cannot be read (the systemic one, the nodes' one) is said to be unknown on
  stderr and exits 1, the other half still listed: never an empty list for a failed read.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import Result
from typer.testing import CliRunner

from autoclusters.clients import incident_listing
from autoclusters.clients.cli import output
from autoclusters.clients.cli.app import app
from autoclusters.workflows.systemic_incident import SystemicIncident
from tests.dev_server_thread import ServedQueue, cli_cluster, served_workflows
from tests.fakes.listed_incidents import AT, ListedNodeIncident, open_node_incident, open_systemic

pytestmark = pytest.mark.integration  # a Temporal dev server


Server = ServedQueue


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with served_workflows("list-cli", [SystemicIncident, ListedNodeIncident]) as srv:
        yield srv


@pytest.fixture
def cluster(server: Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh cluster name, the CLI's settings pointed at it and at the server; the table
    as wide as its rows (not wrapped at a pipe's 80 columns)."""
    monkeypatch.setattr(output.console, "width", 240)
    return cli_cluster(server, monkeypatch)


def listed(*args: str) -> Result:
    return CliRunner().invoke(app, ["incident", "list", *args])


def rows(*args: str) -> list[dict[str, Any]]:
    got = listed("--json", *args)
    assert got.exit_code == 0, got.output
    out: list[dict[str, Any]] = json.loads(got.stdout)
    return out


def until_listed(count: int, *args: str) -> list[dict[str, Any]]:
    """The JSON rows once visibility lists `count` (it catches up within a second or two)."""
    deadline = time.monotonic() + 30
    while len(got := rows(*args)) < count and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(got) == count, got
    return got


def ids(found: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((r["kind"], r["incident_id"]) for r in found)


def test_systemic_incidents_are_listed_beside_the_nodes_and_filtered(
    server: Server, cluster: str
) -> None:
    gpu01 = server.call(open_node_incident(server.client, server.queue, cluster, "gpu-01",
                                           "NVLINK_DOWN", AT))  # fmt: skip
    gpu05 = server.call(open_node_incident(server.client, server.queue, cluster, "gpu-05",
                                           "XID_79", AT))  # fmt: skip
    systemic = server.call(
        open_systemic(server.client, server.queue, cluster, "nvlink", "nvl-a", AT,
                      joined={"gpu-01": "NVLINK_DOWN", "gpu-02": "NVLINK_DOWN"},
                      known=["gpu-03"])
    )  # fmt: skip
    every = until_listed(3)
    assert ids(every) == [("node", gpu01), ("node", gpu05), ("systemic", systemic)]
    (row,) = [r for r in every if r["kind"] == "systemic"]
    assert (row["level"], row["domain"], row["state"], row["status"]) == (
        "nvlink", "nvl-a", "open", "running",
    )  # fmt: skip
    assert [(m["node"], m["fault"], m["drained"]) for m in row["members"]] == [
        ("gpu-01", "NVLINK_DOWN", True), ("gpu-02", "NVLINK_DOWN", True), ("gpu-03", "", False),
    ]  # fmt: skip

    table = listed()
    assert table.exit_code == 0, table.output
    line = next(x for x in table.output.splitlines() if systemic in x)
    assert "systemic" in line and "nvlink nvl-a: gpu-01, gpu-02, gpu-03" in line
    assert "NVLINK_DOWN" in line and "open" in line

    # A node filter: the node's own incident and the systemic incidents it is a member of.
    assert ids(rows("--node", "gpu-01")) == [("node", gpu01), ("systemic", systemic)]
    assert ids(rows("--node", "gpu-02")) == [("systemic", systemic)]  # a member, no own row
    assert ids(rows("--node", "gpu-05")) == [("node", gpu05)]
    assert ids(rows("--state", "open")) == ids(every)
    assert rows("--state", "resolved") == []
    assert ids(rows("--fault", "XID_79")) == [("node", gpu05)]
    assert ids(rows("--fault", "NVLINK_DOWN")) == [("node", gpu01), ("systemic", systemic)]


def test_a_systemic_incident_no_worker_answers_is_listed_unknown(
    server: Server, cluster: str
) -> None:
    nobody = f"nobody-{uuid.uuid4().hex[:6]}"  # no worker polls it: its query never answers
    systemic = server.call(
        open_systemic(server.client, nobody, cluster, "leaf", "leaf-09", AT, joined={},
                      known=["gpu-01"])
    )  # fmt: skip
    # Under a node filter it cannot judge: listed, unknown, not left out.
    (row,) = until_listed(1, "--node", "gpu-42")
    assert (row["incident_id"], row["state"], row["members"], row["level"]) == (
        systemic, "unknown", None, None,
    )  # fmt: skip
    table = listed()
    assert table.exit_code == 0, table.output
    assert "? leaf-09: members unknown" in table.output


@pytest.mark.parametrize("half", ["systemic", "node"])
def test_a_half_that_cannot_be_read_is_unknown_not_empty(
    server: Server, cluster: str, monkeypatch: pytest.MonkeyPatch, half: str
) -> None:
    gpu01 = server.call(open_node_incident(server.client, server.queue, cluster, "gpu-01",
                                           "XID_79", AT))  # fmt: skip
    systemic = server.call(
        open_systemic(server.client, server.queue, cluster, "leaf", "leaf-01", AT,
                      joined={"gpu-01": "IB_LINK_DOWN"}, known=[])
    )  # fmt: skip
    until_listed(2)

    async def away(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("visibility store away")

    name = {"systemic": "list_systemic", "node": "list_incidents"}[half]
    monkeypatch.setattr(incident_listing, name, away)
    got = listed("--json")
    assert got.exit_code == 1, got.output
    still = {"systemic": [("node", gpu01)], "node": [("systemic", systemic)]}[half]
    assert ids(json.loads(got.stdout)) == still
    assert f"{half} incidents: unknown" in got.stderr and "visibility store away" in got.stderr
    table = listed()
    assert table.exit_code == 1 and f"{half} incidents: unknown" in table.stderr
