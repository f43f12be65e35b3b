"""The HTTP API over real HTTP (uvicorn on 127.0.0.1 in a thread, httpx) against a Temporal
dev server with a worker hosting NodeRemediation (update-with-start needs a worker to
accept the report; the incidents then wait on their first activity, which nobody runs).

Aspects covered:
- Alertmanager v4: node from Hostname/hostname/node/kubernetes_node (FQDN → short name),
  instance only as a last resort; fault from the `fault` label, alertname + xid;
  unknown fields, endsAt 0001-01-01 and a groupKey over 1,000 bytes tolerated;
  unmapped alertnames and alerts without a node skipped and listed;
- malformed payloads: 422 naming the field, nothing started;
- auth: missing, wrong or non-bearer token → 401 before the body is read, nothing started;
- dedupe: the same fingerprint+startsAt twice → one update (and through a second API
  replica, Temporal answers the repeated update id without a second update);
- unknown nodes: a payload with alerts for known nodes too starts those and lists the
  unknown (202, `unknown_nodes`, counted in the metrics); one naming only unknown nodes
  is a 404 naming them and starts nothing (with api_unknown_node=skip, a 202 listing them);
- Temporal down: 503 with Retry-After; the retry succeeds once a server listens, and again
  after the server went away and came back; no worker accepting reports: 503, and the
  retry once one polls is recorded once;
- agent reports (NodeReport): open, dedupe on report_id, 404, 422, resolved;
- resolved alerts start nothing and show on the node's incident;
- a firing alert that began before the node's last repair (an incident that closed resolved
  after a reboot) is skipped (`repaired_since`) and starts nothing; one that began after it,
  or before an incident that resolved without a repair, opens an incident;
- reads: list with filters, one incident, 404; /healthz, /readyz, /metrics;
- the storm: 10,000 alerts (100 payloads × 100 alerts, 5 fault kinds) over 100 nodes,
  posted at once → exactly 100 incidents, every alert accepted and counted on its
  incident (answered without waiting for the worker, delivered shortly after);
  posting part of it again changes nothing.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from autoclusters.clients.api.app import create_app
from autoclusters.clients.inventory import NodeInventory, StaticInventory
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.models import IncidentState, workflow_id
from autoclusters.core.node_report import NodeReport
from autoclusters.core.settings_groups import TemporalSettings
from autoclusters.integrations import temporal
from autoclusters.workflows.remediation import NodeRemediation
from tests.helpers import (
    HermeticSettings,
    dev_server_env,  # noqa: F401  (this module's `env`: a dev server)
    start_temporal,
)

pytestmark = pytest.mark.integration  # a Temporal dev server

TOKEN = "test-token-" + uuid.uuid4().hex  # Alertmanager's
AUTH = {"Authorization": f"Bearer {TOKEN}"}
AGENT_TOKEN = "test-agent-token-" + uuid.uuid4().hex  # the agents'
AGENT_AUTH = {"Authorization": f"Bearer {AGENT_TOKEN}"}
READER_TOKEN = "test-reader-token-" + uuid.uuid4().hex  # Prometheus', a reader's
READER_AUTH = {"Authorization": f"Bearer {READER_TOKEN}"}
NODES = [f"gpu-{i:03d}" for i in range(1, 101)]
INVENTORY = StaticInventory(["gpu-[001-100]"])
AM = "/v1/alerts/alertmanager"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest_asyncio.fixture(scope="module")
async def task_queue(env: WorkflowEnvironment) -> AsyncIterator[str]:
    queue = f"api-{uuid.uuid4().hex[:8]}"
    async with Worker(env.client, task_queue=queue, workflows=[NodeRemediation]):
        yield queue


def settings_for(env_address: str, task_queue: str, **changes: Any) -> ApiSettings:
    fields: dict[str, Any] = {
        "temporal": TemporalSettings(address=env_address, task_queue=task_queue),
        "cluster": f"c{uuid.uuid4().hex[:8]}",  # each test counts its own incidents
        "api_tokens": {
            "alertmanager": TOKEN,
            "agent": AGENT_TOKEN,
            "reader": READER_TOKEN,
        },
        "api_inventory": "static",
        # A bound for a hang, not a speed: 5 s was once too short for the local server beside
        # the rest of `make test` (a 503 "did not accept"); the tests of that 503 set their own.
        "api_temporal_timeout_s": 30,
        "api_retry_after_s": 3,
    }
    return HermeticSettings(**{**fields, **changes})


@asynccontextmanager
async def api_server(
    settings: ApiSettings, inventory: NodeInventory = INVENTORY
) -> AsyncIterator[httpx.AsyncClient]:
    """The API in uvicorn on a free loopback port, in its own thread and event loop."""
    config = uvicorn.Config(
        create_app(settings, inventory=inventory),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api-under-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    # Idle connections are dropped here before uvicorn closes them (its keep-alive is 5 s,
    # as httpx's default): reusing one the server is closing that moment is a ReadError.
    limits = httpx.Limits(
        max_connections=100,
        max_keepalive_connections=100,
        keepalive_expiry=config.timeout_keep_alive / 2,
    )
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=60, limits=limits, trust_env=False
        ) as http:
            yield http
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 15)
        assert not thread.is_alive(), "the API did not stop"


@pytest_asyncio.fixture
async def settings(env: WorkflowEnvironment, task_queue: str) -> ApiSettings:
    return settings_for(env.client.service_client.config.target_host, task_queue)


@pytest_asyncio.fixture
async def http(settings: ApiSettings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_server(settings) as client:
        yield client


# --- payloads -------------------------------------------------------------------------------

STARTS = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)


def alert(
    node: str | None = "gpu-001",
    alertname: str = "GpuXidError",
    *,
    status: str = "firing",
    fingerprint: str | None = None,
    starts_at: datetime = STARTS,
    node_label: str = "Hostname",
    **labels: str,
) -> dict[str, Any]:
    all_labels = {"alertname": alertname, "gpu": "3", "instance": "10.1.2.3:9400", **labels}
    if alertname == "GpuXidError":
        all_labels.setdefault("xid", "79")
    if node is not None:
        all_labels[node_label] = node
    return {
        "status": status,
        "labels": all_labels,
        "annotations": {"summary": f"{alertname} on {node}"},
        "startsAt": starts_at.isoformat().replace("+00:00", "Z"),
        "endsAt": "0001-01-01T00:00:00Z"
        if status == "firing"
        else (starts_at + timedelta(minutes=5)).isoformat(),
        "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
        "fingerprint": fingerprint or uuid.uuid4().hex[:16],
    }


def payload(*alerts: dict[str, Any]) -> dict[str, Any]:
    return {
        "version": "4",
        # Longer than a Temporal workflow id may be: never used as one.
        "groupKey": '{}/{severity="critical"}:{alertname="GpuXidError"}' + "x" * 1500,
        "truncatedAlerts": 0,
        "status": "firing" if any(a["status"] == "firing" for a in alerts) else "resolved",
        "receiver": "autoclusters",
        "groupLabels": {"alertname": "GpuXidError"},
        "commonLabels": {"severity": "critical"},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": list(alerts),
        # Newer Alertmanagers add fields; they must not break the parser.
        "notification_reason": "new_alerts",
        "routeLabels": {"team": "gpu"},
    }


# --- Temporal checks --------------------------------------------------------------------------


async def started(client: Client, settings: ApiSettings, node: str) -> bool:
    """Strongly consistent (describe, not visibility): does the node's incident exist?"""
    try:
        await client.get_workflow_handle(workflow_id(settings.cluster, node)).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def updates_accepted(client: Client, settings: ApiSettings, node: str) -> int:
    handle = client.get_workflow_handle(workflow_id(settings.cluster, node))
    history = await handle.fetch_history()
    accepted = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
    return sum(
        e.event_type == accepted
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
        == "report_fault"
        for e in history.events
    )


async def status(client: Client, settings: ApiSettings, node: str) -> IncidentState:
    handle = client.get_workflow_handle_for(
        NodeRemediation.run, workflow_id(settings.cluster, node)
    )
    return await handle.query(NodeRemediation.status)


async def eventually(check: Callable[[], Awaitable[Any]], want: Any, timeout_s: float = 15) -> Any:
    """Visibility is eventually consistent: poll until `check()` gives `want`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got == want or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


def incident_count(client: Client, settings: ApiSettings) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        query = f"WorkflowType = 'NodeRemediation' AND Cluster = '{settings.cluster}'"
        return (await client.count_workflows(query)).count

    return count


# --- Alertmanager -----------------------------------------------------------------------------


async def test_alerts_open_one_incident_per_node_whatever_label_names_it(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    body = payload(
        alert("gpu-001", "GpuXidError", xid="79"),
        alert("gpu-002.cluster.local", "GpuRowRemapFailure", node_label="hostname"),
        alert("gpu-003", "GpuDoubleBitEcc", node_label="node"),
        alert("gpu-004", "GpuMissing", node_label="kubernetes_node"),
        # No node label: the instance's host part, as a last resort.
        alert(None, "InfinibandLinkDown", instance="gpu-005:9100"),
        # Our rules name the fault outright; the label wins over the alertname.
        alert("gpu-006", "SomethingElse", fault="XID_48"),
        alert("gpu-001", "GpuXidError", xid="95"),  # a second fault joins gpu-001's incident
        alert("gpu-007", "DiskFull"),  # not ours
        alert(None, "GpuRowRemapFailure"),  # ours, but the exporter pod's IP names no node
    )
    r = await http.post(AM, json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    got = r.json()
    assert got["accepted"] == 7 and got["deduplicated"] == 0 and got["resolved"] == 0
    assert {(s["index"], s["reason"]) for s in got["skipped"]} == {(7, "unmapped"), (8, "no_node")}
    by_node = {i["node"]: i for i in got["incidents"]}
    assert sorted(by_node) == [f"gpu-00{i}" for i in range(1, 7)]
    assert all(i["opened"] for i in by_node.values())
    assert by_node["gpu-001"]["workflow_id"] == workflow_id(settings.cluster, "gpu-001")

    c = env.client
    want = {
        "gpu-001": ["XID_79", "XID_95"],
        "gpu-002": ["ROW_REMAP_FAILURE"],
        "gpu-003": ["ECC_DBE"],
        "gpu-004": ["GPU_COUNT_LOW"],
        "gpu-005": ["IB_LINK_DOWN"],
        "gpu-006": ["XID_48"],
    }
    for node, faults in want.items():
        state = await status(c, settings, node)
        assert state.request.opened_by == "alertmanager"
        assert sorted(f.fault for f in state.faults) == faults, node
        assert all(f.source == "alertmanager" for f in state.faults)
    assert not await started(c, settings, "gpu-007")
    assert await eventually(incident_count(c, settings), 6) == 6


@pytest.mark.parametrize(
    ("breakage", "field"),
    [
        (lambda p: p.pop("alerts"), "alerts"),
        (lambda p: p["alerts"][1].pop("startsAt"), "alerts[1].startsAt"),
        (lambda p: p["alerts"][1].update(startsAt="yesterday"), "alerts[1].startsAt"),
        (lambda p: p["alerts"][1].update(status="burning"), "alerts[1].status"),
        (lambda p: p["alerts"][1].update(labels=["gpu-001"]), "alerts[1].labels"),
        (lambda p: p.update(version="3"), "version"),
    ],
)
async def test_malformed_payload_is_422_naming_the_field_and_starts_nothing(
    env: WorkflowEnvironment,
    settings: ApiSettings,
    http: httpx.AsyncClient,
    breakage: Callable[[dict[str, Any]], Any],
    field: str,
) -> None:
    body = payload(alert("gpu-001"), alert("gpu-002"))
    breakage(body)
    r = await http.post(AM, json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert field in r.json()["fields"]
    assert field in r.json()["detail"]
    for node in ("gpu-001", "gpu-002"):
        assert not await started(env.client, settings, node)


async def test_body_that_is_not_json_is_422(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    r = await http.post(AM, content=b'{"version": "4", "alerts": [', headers=AUTH)
    assert r.status_code == 422
    assert r.json()["fields"] == ["(body)"]


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer not-the-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer"},
    ],
    ids=["none", "wrong", "not-bearer", "empty"],
)
async def test_writes_without_a_valid_token_are_401_and_start_nothing(
    env: WorkflowEnvironment,
    settings: ApiSettings,
    http: httpx.AsyncClient,
    headers: dict[str, str],
) -> None:
    r = await http.post(AM, json=payload(alert("gpu-001")), headers=headers)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    # The token is checked before the body is read: a broken body changes nothing.
    r = await http.post(AM, content=b"not json", headers=headers)
    assert r.status_code == 401
    rep = NodeReport.build(
        node="gpu-001", fault="XID_79", state="firing", observed_at=STARTS, since=STARTS
    )
    r = await http.post("/v1/reports", content=rep.model_dump_json(), headers=headers)
    assert r.status_code == 401
    assert not await started(env.client, settings, "gpu-001")
    metrics = (await http.get("/metrics")).text
    assert (
        'autoclusters_api_requests_refused_total{endpoint="alertmanager",reason="unauthorized"} 2.0'
        in metrics
    )


async def test_no_configured_token_refuses_every_write(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    s = settings_for(env.client.service_client.config.target_host, task_queue, api_tokens={})
    async with api_server(s) as http:
        r = await http.post(AM, json=payload(alert("gpu-001")), headers=AUTH)
        assert r.status_code == 401
        assert "no API tokens" in r.json()["detail"]
    assert not await started(env.client, s, "gpu-001")


async def test_same_fingerprint_and_starts_at_twice_is_one_update(
    env: WorkflowEnvironment, task_queue: str, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    first = alert("gpu-010", fingerprint="1a30ba71cca2921f")
    r1 = await http.post(AM, json=payload(first), headers=AUTH)
    # Alertmanager's retry (it got a 5xx, or no answer): the very same alert.
    r2 = await http.post(AM, json=payload(first), headers=AUTH)
    assert (r1.status_code, r2.status_code) == (202, 202)
    assert (r1.json()["deduplicated"], r2.json()["deduplicated"]) == (0, 1)
    assert r1.json()["incidents"][0]["incident_id"] == r2.json()["incidents"][0]["incident_id"]
    assert await updates_accepted(env.client, settings, "gpu-010") == 1

    # A second API replica (its own dedupe store; or this one after a restart) gets the same
    # alert: the incident knows its key, answers `repeat`, and records nothing new.
    async with api_server(settings) as replica:
        r3 = await replica.post(AM, json=payload(first), headers=AUTH)
        assert r3.status_code == 202 and r3.json()["deduplicated"] == 1
        assert r3.json()["incidents"][0]["opened"] is False
        assert (
            'autoclusters_api_incidents_total{outcome="opened"} 0.0'
            in (await replica.get("/metrics")).text
        )
    state = await env.client.get_workflow_handle(workflow_id(settings.cluster, "gpu-010")).query(
        NodeRemediation.status
    )
    assert [(f.fault, f.count) for f in state.faults] == [("XID_79", 1)]

    # The same alert firing again later (new startsAt) is a new event: it joins.
    again = alert("gpu-010", fingerprint="1a30ba71cca2921f", starts_at=STARTS + timedelta(hours=1))
    r4 = await http.post(AM, json=payload(again), headers=AUTH)
    assert r4.status_code == 202 and r4.json()["deduplicated"] == 0
    assert r4.json()["incidents"][0]["opened"] is False
    # Of a fault kind the open incident has: answered at once, on the incident shortly after.
    reports = lambda: updates_accepted(env.client, settings, "gpu-010")  # noqa: E731
    assert await eventually(reports, 3) == 3
    metrics = (await http.get("/metrics")).text
    assert 'autoclusters_api_alerts_deduplicated_total{source="alertmanager"} 1.0' in metrics


async def test_a_payload_naming_only_unknown_nodes_is_404_and_starts_nothing(
    env: WorkflowEnvironment, task_queue: str, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    body = payload(alert("gpu-999"), alert("ghost.example.com"))
    r = await http.post(AM, json=body, headers=AUTH)
    assert r.status_code == 404, r.text
    assert r.json()["nodes"] == ["ghost.example.com", "gpu-999"]
    assert "gpu-999" in r.json()["detail"] and "alerts[0]" in r.json()["detail"]
    assert not await started(env.client, settings, "gpu-999")

    # Resolved alerts never start anything: an unknown node there is no reason to refuse.
    r = await http.post(AM, json=payload(alert("gpu-999", status="resolved")), headers=AUTH)
    assert r.status_code == 202

    skip = settings_for(settings.temporal.address, task_queue, api_unknown_node="skip")
    async with api_server(skip) as lenient:
        r = await lenient.post(AM, json=body, headers=AUTH)
        assert r.status_code == 202, r.text
        assert r.json()["accepted"] == 0
        assert r.json()["unknown_nodes"] == ["ghost.example.com", "gpu-999"]
    assert not await started(env.client, skip, "gpu-999")


async def test_a_payload_with_unknown_nodes_starts_the_known_ones_and_lists_the_rest(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    # Alertmanager does not retry a 4xx: refusing the payload would lose gpu-020's alert.
    body = payload(alert("gpu-020"), alert("gpu-999"), alert("ghost.example.com"))
    r = await http.post(AM, json=body, headers=AUTH)
    assert r.status_code == 202, r.text
    answer = r.json()
    assert answer["accepted"] == 1
    assert [i["node"] for i in answer["incidents"]] == ["gpu-020"]
    assert answer["incidents"][0]["opened"] is True
    assert answer["unknown_nodes"] == ["ghost.example.com", "gpu-999"]
    skipped = {s["node"]: (s["index"], s["reason"]) for s in answer["skipped"]}
    assert skipped == {
        "gpu-999": (1, "unknown_node"),
        "ghost.example.com": (2, "unknown_node"),
    }
    assert await started(env.client, settings, "gpu-020")
    assert not await started(env.client, settings, "gpu-999")
    state = await status(env.client, settings, "gpu-020")
    assert [(f.fault, f.count) for f in state.faults] == [("XID_79", 1)]

    metrics = (await http.get("/metrics")).text
    rejected = 'autoclusters_api_alerts_rejected_total{reason="unknown_node",source="alertmanager"}'
    assert f"{rejected} 2.0" in metrics
    assert 'autoclusters_api_requests_partial_total{source="alertmanager"} 1.0' in metrics
    assert 'autoclusters_api_requests_refused_total{endpoint="alertmanager"' not in metrics


async def test_temporal_down_is_503_and_the_retry_succeeds_once_it_is_back(
    task_queue: str,
) -> None:
    port = free_port()
    s = settings_for(f"127.0.0.1:{port}", task_queue, api_temporal_timeout_s=2)
    body = payload(alert("gpu-030", fingerprint="00000000000000aa"))
    async with api_server(s) as http:
        r = await http.post(AM, json=body, headers=AUTH)
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"] == "3"
        assert f"127.0.0.1:{port}" in r.json()["detail"]
        assert (await http.get("/readyz")).status_code == 503
        assert (await http.get("/healthz")).json() == {"status": "ok", "temporal": "not connected"}

        # Temporal comes up at that address: Alertmanager's retry gets through.
        down_at = time.monotonic()
        env = await start_temporal(port)
        try:
            async with Worker(env.client, task_queue=task_queue, workflows=[NodeRemediation]):
                r = await http.post(AM, json=body, headers=AUTH)
                assert r.status_code == 202, r.text
                assert r.json()["deduplicated"] == 0  # the 503 accepted nothing
                assert await started(env.client, s, "gpu-030")
                assert (await http.get("/readyz")).status_code == 200
        finally:
            await env.shutdown()

        # It goes away again (the client is connected now): 503 within the timeout.
        later = payload(alert("gpu-031", fingerprint="00000000000000bb"))
        t = time.monotonic()
        r = await http.post(AM, json=later, headers=AUTH)
        assert r.status_code == 503, r.text
        assert time.monotonic() - t < 10

        env = await start_temporal(port)  # a fresh (in-memory) server at the same address
        try:
            async with Worker(env.client, task_queue=task_queue, workflows=[NodeRemediation]):
                r = await http.post(AM, json=later, headers=AUTH)
                assert r.status_code == 202, r.text
                assert await started(env.client, s, "gpu-031")
        finally:
            await env.shutdown()
        metrics = (await http.get("/metrics")).text
        assert "autoclusters_api_temporal_errors_total" in metrics
        assert time.monotonic() - down_at < 60


async def test_no_worker_is_503_and_the_retry_is_recorded_once(env: WorkflowEnvironment) -> None:
    # Nobody polls this task queue yet: Temporal starts the workflow but no worker accepts
    # the report, so the API may not say 202.
    queue = f"idle-{uuid.uuid4().hex[:8]}"
    s = settings_for(env.client.service_client.config.target_host, queue, api_temporal_timeout_s=1)
    body = payload(alert("gpu-035", fingerprint="00000000000000dd"))
    async with api_server(s) as http:
        r = await http.post(AM, json=body, headers=AUTH)
        assert r.status_code == 503, r.text
        assert "worker" in r.json()["detail"] and r.headers["Retry-After"] == "3"
        async with Worker(env.client, task_queue=queue, workflows=[NodeRemediation]):
            r = await http.post(AM, json=body, headers=AUTH)
            assert r.status_code == 202, r.text
            # The report admitted before and its retry carry one key: recorded once.
            state = await status(env.client, s, "gpu-035")
            assert [(f.fault, f.count) for f in state.faults] == [("XID_79", 1)]


# --- the node agent ---------------------------------------------------------------------------


async def test_agent_reports_open_dedupe_and_resolve(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    since = datetime.now(UTC)
    rep = NodeReport.build(
        node="gpu-040", fault="ECC_DBE", state="firing", observed_at=since, since=since,
        message="GPU 3: 2 uncorrected volatile ECC errors", evidence={"subjects": [{"gpu": 3}]},
    )  # fmt: skip
    r = await http.post("/v1/reports", content=rep.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202, r.text
    assert r.json()["accepted"] == 1 and r.json()["incidents"][0]["opened"]
    incident_id = r.json()["incidents"][0]["incident_id"]
    # The agent's retry of the same report (same report_id) is a repeat.
    r = await http.post("/v1/reports", content=rep.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202 and r.json()["deduplicated"] == 1
    state = await status(env.client, settings, "gpu-040")
    assert state.request.opened_by == "agent" and [f.fault for f in state.faults] == ["ECC_DBE"]
    assert await updates_accepted(env.client, settings, "gpu-040") == 1

    resolved = NodeReport.build(
        node="gpu-040", fault="ECC_DBE", state="resolved",
        observed_at=since + timedelta(minutes=3), since=since,
    )  # fmt: skip
    r = await http.post("/v1/reports", content=resolved.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 202 and r.json()["resolved"] == 1
    r = await http.get(f"/v1/incidents/{incident_id}")
    assert r.status_code == 200, r.text
    assert [a["fault"] for a in r.json()["resolved_alerts"]] == ["ECC_DBE"]
    assert r.json()["resolved_alerts"][0]["source"] == "agent"
    assert await updates_accepted(env.client, settings, "gpu-040") == 1

    unknown = NodeReport.build(
        node="gpu-404", fault="XID_79", state="firing", observed_at=since, since=since
    )
    r = await http.post("/v1/reports", content=unknown.model_dump_json(), headers=AGENT_AUTH)
    assert r.status_code == 404 and r.json()["nodes"] == ["gpu-404"]

    bad = rep.model_dump(mode="json") | {"fault": "xid79"}
    r = await http.post("/v1/reports", json=bad, headers=AGENT_AUTH)
    assert r.status_code == 422 and r.json()["fields"] == ["fault"]


async def test_resolved_alerts_start_nothing_and_show_on_the_incident(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    r = await http.post(AM, json=payload(alert("gpu-050", status="resolved")), headers=AUTH)
    assert r.status_code == 202 and r.json() | {"skipped": []} == {
        "accepted": 0, "deduplicated": 0, "resolved": 1, "skipped": [], "incidents": [],
        "unknown_nodes": [],
    }  # fmt: skip
    assert not await started(env.client, settings, "gpu-050")

    firing = alert("gpu-051", "GpuRowRemapFailure", fingerprint="00000000000000cc")
    r = await http.post(AM, json=payload(firing), headers=AUTH)
    incident_id = r.json()["incidents"][0]["incident_id"]
    resolved = firing | {"status": "resolved", "endsAt": "2026-05-01T10:07:00Z"}
    for _ in range(2):  # the second is Alertmanager's retry: recorded once
        r = await http.post(AM, json=payload(resolved), headers=AUTH)
        assert r.status_code == 202
    detail = (await http.get(f"/v1/incidents/{incident_id}")).json()
    assert [(a["fault"], a["resolved_at"]) for a in detail["resolved_alerts"]] == [
        ("ROW_REMAP_FAILURE", "2026-05-01T10:07:00Z")
    ]
    assert await updates_accepted(env.client, settings, "gpu-051") == 1


@workflow.defn(name="NodeRemediation")
class PastIncident:
    """An earlier incident as visibility sees it once it closed: its last status and rung."""

    @workflow.run
    async def run(self, status: str, action: str) -> None:
        workflow.upsert_search_attributes(
            [temporal.INCIDENT_STATUS.value_set(status), temporal.REPAIR_ACTION.value_set(action)]
        )


async def past_incident(
    client: Client, settings: ApiSettings, node: str, status: str, action: str
) -> datetime:
    """Run one to its close; when it closed, once visibility lists it."""
    queue, wid = f"past-{uuid.uuid4().hex[:8]}", f"past-{node}-{uuid.uuid4().hex[:8]}"
    attrs = TypedSearchAttributes(
        [
            SearchAttributePair(temporal.CLUSTER, settings.cluster),
            SearchAttributePair(temporal.NODE, node),
            SearchAttributePair(temporal.INCIDENT_ID, f"inc-past-{node}"),
            SearchAttributePair(temporal.INCIDENT_STATUS, "open"),
        ]
    )
    async with Worker(
        client, task_queue=queue, workflows=[PastIncident],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):  # fmt: skip
        await client.execute_workflow(
            PastIncident.run, args=[status, action], id=wid, task_queue=queue,
            search_attributes=attrs,
        )  # fmt: skip
    listed = f"WorkflowId = '{wid}' AND IncidentStatus = '{status}'"

    async def visible() -> int:
        return (await client.count_workflows(listed)).count

    assert await eventually(visible, 1) == 1, "visibility never listed the closed incident"
    closed = (await client.get_workflow_handle(wid).describe()).close_time
    assert closed is not None
    return closed


async def test_an_alert_from_before_the_nodes_last_repair_starts_nothing(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    repaired = await past_incident(env.client, settings, "gpu-060", "resolved", "reboot")
    screened = await past_incident(env.client, settings, "gpu-061", "resolved", "none")
    # A restarted Prometheus's re-fire: it began before the reboot.
    stale = alert("gpu-060", starts_at=repaired - timedelta(seconds=30))
    r = await http.post(AM, json=payload(stale), headers=AUTH)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["accepted"] == 0 and body["incidents"] == []
    [skipped] = body["skipped"]
    assert skipped["reason"] == "repaired_since" and skipped["node"] == "gpu-060"
    assert "inc-past-gpu-060" in skipped["detail"]
    assert not await started(env.client, settings, "gpu-060")
    # No repair on the earlier incident: nothing proves the fault gone, it opens one.
    unrepaired = alert("gpu-061", starts_at=screened - timedelta(seconds=30))
    r = await http.post(AM, json=payload(unrepaired), headers=AUTH)
    assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
    assert await started(env.client, settings, "gpu-061")
    # A fault that began after the repair is a new one.
    fresh = alert("gpu-060", starts_at=repaired + timedelta(seconds=1))
    r = await http.post(AM, json=payload(fresh), headers=AUTH)
    assert r.status_code == 202 and r.json()["accepted"] == 1, r.text
    assert r.json()["skipped"] == []
    assert await started(env.client, settings, "gpu-060")


# --- reads ------------------------------------------------------------------------------------


async def test_list_and_read_incidents(
    env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient
) -> None:
    body = payload(alert("gpu-060", xid="79"), alert("gpu-061", "InfinibandLinkDown"))
    r = await http.post(AM, json=body, headers=AUTH)
    assert r.status_code == 202
    ids = {i["node"]: i["incident_id"] for i in r.json()["incidents"]}

    async def listed(query: str) -> list[str]:
        r = await http.get(f"/v1/incidents{query}")
        assert r.status_code == 200, r.text
        return sorted(i["node"] for i in r.json()["incidents"])

    assert await eventually(lambda: listed(""), ["gpu-060", "gpu-061"]) == ["gpu-060", "gpu-061"]
    assert await eventually(lambda: listed("?state=open"), ["gpu-060", "gpu-061"]) == [
        "gpu-060",
        "gpu-061",
    ]
    assert await listed("?fault=IB_LINK_DOWN") == ["gpu-061"]
    assert await listed("?node=gpu-060") == ["gpu-060"]
    assert await listed("?state=resolved") == []
    assert len((await http.get("/v1/incidents?limit=1")).json()["incidents"]) == 1
    assert (await http.get("/v1/incidents?limit=0")).status_code == 422
    # A state outside the set is refused, naming the field: never an empty list.
    hostile = await http.get("/v1/incidents", params={"state": "x' OR 1=1"})
    assert hostile.status_code == 422, hostile.text
    assert hostile.json()["detail"][0]["loc"] == ["query", "state"]

    r = await http.get(f"/v1/incidents/{ids['gpu-060']}")
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["temporal_status"] == "running"
    assert got["workflow_id"] == workflow_id(settings.cluster, "gpu-060")
    assert got["incident"]["request"]["node"] == "gpu-060"
    assert got["incident"]["status"] == "open"

    r = await http.get("/v1/incidents/inc-20260101-000000-gpu-060")
    assert r.status_code == 404 and "inc-20260101-000000-gpu-060" in r.json()["detail"]


async def test_reads_need_a_token_when_configured(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    s = settings_for(env.client.service_client.config.target_host, task_queue, api_auth_reads=True)
    async with api_server(s) as http:
        assert (await http.get("/v1/incidents")).status_code == 401
        assert (await http.get("/v1/incidents", headers=READER_AUTH)).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200


async def test_metrics_need_a_token_unless_the_api_and_its_caller_are_on_loopback(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    s = settings_for(env.client.service_client.config.target_host, task_queue, api_host="0.0.0.0")
    async with api_server(s) as http:
        r = await http.get("/metrics")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert (await http.get("/metrics", headers=READER_AUTH)).status_code == 200
        assert (await http.get("/healthz")).status_code == 200


async def test_health_and_metrics(http: httpx.AsyncClient) -> None:
    await http.post(AM, json=payload(alert("gpu-070")), headers=AUTH)
    assert (await http.get("/healthz")).json() == {"status": "ok", "temporal": "connected"}
    assert (await http.get("/readyz")).status_code == 200
    r = await http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for line in [
        'autoclusters_api_alerts_received_total{source="alertmanager",status="firing"} 1.0',
        'autoclusters_api_incidents_total{outcome="opened"} 1.0',
        "autoclusters_api_temporal_call_duration_seconds_count 1.0",
        "autoclusters_api_request_duration_seconds_count"
        '{code="202",endpoint="/v1/alerts/alertmanager"} 1.0',
    ]:
        assert line in text, line


# --- the storm --------------------------------------------------------------------------------

STORM_FAULTS: list[tuple[str, dict[str, Any], str]] = [
    ("GpuXidError", {"xid": "79"}, "XID_79"),
    ("GpuRowRemapFailure", {}, "ROW_REMAP_FAILURE"),
    ("GpuDoubleBitEcc", {}, "ECC_DBE"),
    ("GpuMissing", {}, "GPU_COUNT_LOW"),
    ("InfinibandLinkDown", {}, "IB_LINK_DOWN"),
]


def storm(payloads: int = 100, nodes: list[str] = NODES) -> list[dict[str, Any]]:
    """Alertmanager grouped by alertname: every payload holds one alert per node."""
    out = []
    for p in range(payloads):
        name, labels, _ = STORM_FAULTS[p % len(STORM_FAULTS)]
        out.append(
            payload(
                *(
                    alert(node, name, fingerprint=f"{p:08x}{n:08x}", gpu=str(p % 8), **labels)
                    for n, node in enumerate(nodes)
                )
            )
        )
    return out


# Every alert of the storm accepted, once: it starts before the sandboxes' boots load the
# machine (tests/conftest.py LONGEST_FIRST). How fast is bench/ingest.py's to say.
async def test_storm_of_10000_alerts_over_100_nodes_opens_exactly_100_incidents(
    env: WorkflowEnvironment, task_queue: str
) -> None:
    # The API, the worker and this client share one process (and its GIL) here, beside the
    # rest of `make test` on two cores: give a request much more time than in production
    # before it answers 503 (30 s was not enough on a slower machine).
    settings = settings_for(
        env.client.service_client.config.target_host, task_queue, api_temporal_timeout_s=120
    )
    async with api_server(settings) as http:
        await _storm(env, settings, http)


async def _storm(env: WorkflowEnvironment, settings: ApiSettings, http: httpx.AsyncClient) -> None:
    payloads = storm()
    answers = await asyncio.gather(*(http.post(AM, json=p, headers=AUTH) for p in payloads))
    bad = [r.text for r in answers if r.status_code != 202]
    assert not bad, (len(bad), bad[:2])
    assert sum(r.json()["accepted"] for r in answers) == 10_000
    assert sum(r.json()["deduplicated"] for r in answers) == 0
    opened = [i["node"] for r in answers for i in r.json()["incidents"] if i["opened"]]
    assert sorted(opened) == NODES  # each node's incident opened once, by one alert

    c = env.client
    assert await eventually(incident_count(c, settings), 100, timeout_s=90) == 100
    # A storm is answered without waiting for the worker (clients/api/storm.py): what was
    # answered `joined` reaches each incident in batches shortly after, every alert
    # counted (100 per node, 20 of each kind).
    want = sorted((f, 20) for *_, f in STORM_FAULTS)

    async def kinds_and_counts() -> list[list[tuple[str, int]]]:
        states = await asyncio.gather(*(status(c, settings, n) for n in NODES))
        assert [s.request.node for s in states] == NODES
        return [sorted((f.fault, f.count) for f in s.faults) for s in states]

    assert await eventually(kinds_and_counts, [want] * 100, timeout_s=90) == [want] * 100

    metrics = (await http.get("/metrics")).text
    assert 'autoclusters_api_incidents_total{outcome="opened"} 100.0' in metrics
    assert 'autoclusters_api_incidents_total{outcome="joined"} 9900.0' in metrics

    # Alertmanager retries part of it (say, after a timeout): all repeats, nothing new.
    again = await asyncio.gather(*(http.post(AM, json=p, headers=AUTH) for p in payloads[:10]))
    assert [r.json()["deduplicated"] for r in again] == [100] * 10
    assert await incident_count(c, settings)() == 100
