"""The web console (clients/console) over HTTP, with a fake of what it reads:

- logging in with the API's token sets an HttpOnly, SameSite=Strict cookie scoped to /ui;
  a wrong token is refused and sets nothing; a forged, expired or revoked cookie is refused;
- without a cookie or bearer header every console route answers 401 (pages with the login
  form); the bearer header alone is enough; loopback is open only when the API binds
  loopback *and* `[console] loopback_open` says so;
- whatever a source says is escaped: an alert annotation or a Slurm reason holding
  `<script>` is shown as text;
- the topology groups nodes by IB pod, then leaf, then node set, and colours a node with an
  open incident quarantined (waiting for approval, repairing, spare likewise);
- the incident page lists its timeline's steps, its evidence and its notifications; the
  notifications feed lists what was sent; the node page says when no Prometheus is
  configured and draws what Prometheus answers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from starlette.requests import Request
from temporalio.client import Client

from autoclusters.clients.console import prometheus, topology
from autoclusters.clients.console.routes import Console
from autoclusters.clients.console.session import COOKIE, NotLoggedIn, Sessions
from autoclusters.clients.console.sources import IncidentRead
from autoclusters.clients.incidents import (
    IncidentNotFound,
    IncidentSummary,
    SystemicIncidentFound,
)
from autoclusters.clients.inventory import StaticInventory
from autoclusters.clients.server import create_server
from autoclusters.clients.systemic_incidents import SystemicRead
from autoclusters.clients.web.auth import BearerAuth
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.cluster import ClusterState, Placement, render_topology
from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.guard import GuardState, GuardStatus
from autoclusters.core.ladder_figures import LadderFigures
from autoclusters.core.models import (
    SPARE_REASON,
    FaultSeen,
    IncidentRequest,
    IncidentState,
    SlurmNode,
    StepOutcome,
    StepRecord,
    Waiting,
)
from autoclusters.core.policy import GuardPolicy
from autoclusters.core.settings_groups import ConsoleSettings, TemporalSettings
from autoclusters.core.systemic import SystemicState
from tests.helpers import HermeticSettings

TOKEN = "console-test-token-0123"
EVIL = "<script>alert('owned')</script>"
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def settings(**changes: Any) -> ApiSettings:
    fields: dict[str, Any] = {
        "cluster": "c1",
        "api_tokens": {"ops": {"role": "reader", "token": TOKEN}},
        "api_inventory": "static",
        "api_nodes": ["gpu-0[1-5]"],
        "temporal": TemporalSettings(ui_url="http://temporal.example:8233"),
    }
    return HermeticSettings(**{**fields, **changes})


def incident(
    node: str, *, step: str | None = "drain", waiting: Waiting | None = None
) -> IncidentState:
    req = IncidentRequest(
        incident_id=f"inc-20261130-120000-{node}",
        cluster="c1",
        node=node,
        fault="XID_79",
        opened_at=T0,
        opened_by="alertmanager",
    )

    def rec(name: str, at: int, took: int | None = 1, detail: str = "") -> StepRecord:
        done = T0 + timedelta(seconds=at + took) if took is not None else None
        outcome: StepOutcome = "ok" if took is not None else "running"
        started = T0 + timedelta(seconds=at)
        return StepRecord(
            name=name, started_at=started, finished_at=done, outcome=outcome, detail=detail
        )

    steps = [
        rec("guard_register", 0),
        rec("notify_opened", 1),
        rec("drain", 2, None, f"reason {EVIL}"),
    ]
    evidence = FaultEvidence(source="alertmanager", summary=EVIL, labels={"xid": "79"})
    fault = FaultSeen(
        fault="XID_79", source="alertmanager", first_at=T0, last_at=T0, evidence=[evidence]
    )
    return IncidentState(
        request=req, current_step=step, waiting_for=waiting, steps=steps, faults=[fault]
    )


class FakeSource:
    """Five nodes on two pods: pod-1 (leaf-a: gpu-01, gpu-02; leaf-b: gpu-03, gpu-04) and
    pod-2 (leaf-c: gpu-05, a spare). gpu-02 has an open incident; gpu-03 is drained by a
    human with a hostile reason."""

    def __init__(self) -> None:
        self.open = [incident("gpu-02")]
        # Systemic incidents: none here (tests/console/test_console_systemic.py adds them).
        self.systemic_reads: list[SystemicRead] = []
        placements = [
            Placement(node="gpu-01", pod="pod-1", leaf="leaf-a"),
            Placement(node="gpu-02", pod="pod-1", leaf="leaf-a"),
            Placement(node="gpu-03", pod="pod-1", leaf="leaf-b"),
            Placement(node="gpu-04", pod="pod-1", leaf="leaf-b"),
            Placement(node="gpu-05", pod="pod-2", leaf="leaf-c"),
        ]
        self.state = ClusterState(
            cluster="c1",
            provider="sandbox",
            node_sets={"gpu": ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], "spares": ["gpu-05"]},
            topology_conf=render_topology(placements),
        )

    async def slurm_nodes(self) -> list[SlurmNode]:
        def n(name: str, **kw: Any) -> SlurmNode:
            return SlurmNode(name=name, state=kw.pop("state", "idle"), gres="gpu:h100:8", **kw)

        return [
            n("gpu-01", state="allocated"),
            n("gpu-02", state_flags=["DRAIN"], reason="autoclusters: inc-x XID_79"),
            n("gpu-03", state_flags=["DRAIN"], reason=f"by hand {EVIL}"),
            n("gpu-04"),
            n("gpu-05", state_flags=["DRAIN"], reason=SPARE_REASON),
        ]

    async def cluster(self) -> ClusterState | None:
        return self.state

    async def guard(self) -> GuardStatus | None:
        state = GuardState(spares=["gpu-05"], repairing={})
        return GuardStatus(cluster="c1", policy=GuardPolicy(), state=state)

    async def open_incidents(self) -> list[IncidentState]:
        return self.open

    async def incidents(
        self, *, node: str | None, state: str | None, limit: int
    ) -> list[IncidentSummary]:
        rows = [
            IncidentSummary(
                incident_id=i.request.incident_id,
                node=i.request.node,
                fault=i.request.fault,
                workflow_id=f"remediation-c1-{i.request.node}",
                status="running",
                state="open",
                started_at=T0,
                closed_at=None,
            )
            for i in self.open
        ]
        return [r for r in rows if node in (None, r.node)][:limit]

    async def incident(self, incident_id: str) -> IncidentRead:
        for i in self.open:
            if i.request.incident_id == incident_id:
                wf = f"remediation-c1-{i.request.node}"
                return IncidentRead(state=i, workflow_id=wf, temporal_status="running")
        if any(r.state.request.incident_id == incident_id for r in self.systemic_reads):
            raise SystemicIncidentFound(f"{incident_id} is a systemic incident")
        raise IncidentNotFound(f"no incident {incident_id}")

    async def systemic_incidents(self) -> list[SystemicState]:
        return [r.state for r in self.systemic_reads if r.state.status == "open"]

    async def systemic(self, incident_id: str) -> SystemicRead:
        for r in self.systemic_reads:
            if r.state.request.incident_id == incident_id:
                return r
        raise IncidentNotFound(f"no incident {incident_id}")

    async def recent_states(self, limit: int) -> list[IncidentState]:
        return self.open[:limit]

    async def kubernetes_node(self, node: str) -> dict[str, str] | None:
        return None

    async def ladder(self) -> LadderFigures:
        return LadderFigures()


async def no_temporal() -> Client:
    raise RuntimeError("the console tests never reach Temporal")


def app_for(s: ApiSettings) -> tuple[FastAPI, FakeSource]:
    app = create_server(s, client_factory=no_temporal, inventory=StaticInventory(s.api_nodes))
    source = FakeSource()
    console: Console = app.state.console
    console.source = source
    return app, source


@pytest_asyncio.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    app, _ = app_for(settings())
    transport = httpx.ASGITransport(app=app, client=("10.0.0.9", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        yield client
    await app.state.console.shared.aclose()  # the shared read's loop ends with the test


async def login(http: httpx.AsyncClient, token: str = TOKEN) -> httpx.Response:
    return await http.post(
        "/ui/login",
        content=f"token={token}&next=/ui/incidents",
        headers={"content-type": "application/x-www-form-urlencoded"},
    )


ROUTES = [
    "/ui",
    "/ui/topology",
    "/ui/nodes/gpu-02",
    "/ui/incidents",
    "/ui/incidents/inc-20261130-120000-gpu-02",
    "/ui/notifications",
    "/ui/static/console.js",
    "/ui/api/topology",
    "/ui/api/nodes/gpu-02",
    "/ui/api/nodes/gpu-02/metrics",
    "/ui/api/incidents",
    "/ui/api/incidents/inc-20261130-120000-gpu-02",
    "/ui/api/notifications",
]


# --- authentication ---------------------------------------------------------------------


async def test_login_sets_an_httponly_strict_cookie_and_opens_the_pages(
    http: httpx.AsyncClient,
) -> None:
    answer = await login(http)
    assert answer.status_code == 303
    assert answer.headers["location"] == "/ui/incidents"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    attrs = {a.strip().lower() for a in cookie.split(";")[1:]}
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/ui" in attrs
    assert any(a.startswith("max-age=") for a in attrs)
    for path in ROUTES:
        got = await http.get(path)
        assert got.status_code in (200, 303), (path, got.status_code)
    page = await http.get("/ui/topology")
    assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_without_credentials_every_console_route_answers_401(
    http: httpx.AsyncClient,
) -> None:
    for path in ROUTES:
        got = await http.get(path)
        assert got.status_code == 401, path
        assert "XID_79" not in got.text and "leaf-a" not in got.text, path  # no data leaks
    page = await http.get("/ui/topology")
    assert 'name="token"' in page.text  # a browser sees where to log in
    assert "data-node" not in page.text
    api = await http.get("/ui/api/topology")
    assert api.json()["error"] == "unauthorized"


async def test_a_wrong_token_is_refused_and_sets_no_cookie(http: httpx.AsyncClient) -> None:
    answer = await login(http, "not-the-token")
    assert answer.status_code == 401
    assert "set-cookie" not in answer.headers
    assert "invalid bearer token" in answer.text
    assert (await http.get("/ui/api/topology")).status_code == 401
    wrong = await http.get("/ui/api/topology", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401


async def test_a_forged_cookie_is_refused(http: httpx.AsyncClient) -> None:
    await login(http)
    good = http.cookies[COOKIE]
    name, expires, mac = good.split(".")
    for forged in (f"{name}.{int(expires) + 86400}.{mac}", f"{name}.{expires}.{'0' * 64}", "x"):
        http.cookies.clear()
        http.cookies.set(COOKIE, forged, domain="console.test", path="/ui")
        assert (await http.get("/ui/api/topology")).status_code == 401, forged


async def test_the_bearer_header_alone_is_enough(http: httpx.AsyncClient) -> None:
    got = await http.get("/ui/api/topology", headers={"Authorization": f"Bearer {TOKEN}"})
    assert got.status_code == 200


def test_a_session_expires_and_ends_when_its_token_changes() -> None:
    s = settings(console=ConsoleSettings(session_s=60))
    sessions = Sessions(s, BearerAuth(s), now=1000)
    cookie = sessions.login(TOKEN)[1]
    assert sessions.check_cookie(cookie) == "ops"
    later = Sessions(s, BearerAuth(s), now=1061)
    later._secret = sessions._secret  # the same process, a minute later
    with pytest.raises(NotLoggedIn, match="expired"):
        later.check_cookie(cookie)
    rotated = settings(api_tokens={"ops": {"role": "reader", "token": "a-new-token-0123456"}})
    after = Sessions(rotated, BearerAuth(rotated), now=1000)
    after._secret = sessions._secret
    with pytest.raises(NotLoggedIn, match="invalid"):
        after.check_cookie(cookie)


def _request(client_host: str) -> Request:
    return Request({"type": "http", "headers": [], "client": (client_host, 1), "path": "/ui"})


@pytest.mark.parametrize(
    ("allowed", "bind", "caller", "opened"),
    [
        (True, "127.0.0.1", "127.0.0.1", True),
        (True, "127.0.0.1", "10.0.0.9", False),  # someone else, through a proxy or tunnel
        (True, "0.0.0.0", "127.0.0.1", False),  # the API is reachable from elsewhere
        (False, "127.0.0.1", "127.0.0.1", False),  # the default
    ],
)
def test_loopback_is_open_only_where_the_api_binds_loopback_and_settings_allow(
    allowed: bool, bind: str, caller: str, opened: bool
) -> None:
    s = settings(console=ConsoleSettings(loopback_open=allowed), api_host=bind)
    sessions = Sessions(s, BearerAuth(s))
    if opened:
        assert sessions.caller(_request(caller)) == "loopback"
    else:
        with pytest.raises(NotLoggedIn):
            sessions.caller(_request(caller))


# --- what the pages show ----------------------------------------------------------------


async def test_script_in_an_annotation_or_a_slurm_reason_is_shown_as_text(
    http: httpx.AsyncClient,
) -> None:
    await login(http)
    page = (await http.get("/ui/incidents/inc-20261130-120000-gpu-02")).text
    assert "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;" in page
    assert EVIL not in page
    topo = (await http.get("/ui/topology")).text
    assert "by hand &lt;script&gt;" in topo and EVIL not in topo
    node = (await http.get("/ui/nodes/gpu-03")).text
    assert "&lt;script&gt;" in node and EVIL not in node
    # The JSON is data: the page's script puts it in with textContent.
    api = (await http.get("/ui/api/incidents/inc-20261130-120000-gpu-02")).json()
    assert api["faults"][0]["evidence"][0]["summary"] == EVIL


async def test_topology_groups_nodes_by_pod_then_leaf_and_colours_their_state(
    http: httpx.AsyncClient,
) -> None:
    await login(http)
    view = (await http.get("/ui/api/topology")).json()
    tree = {
        p["name"]: {
            lf["name"]: {g["name"]: [t["node"] for t in g["tiles"]] for g in lf["groups"]}
            for lf in p["leaves"]
        }
        for p in view["pods"]
    }
    assert tree == {
        "pod-1": {"leaf-a": {"gpu": ["gpu-01", "gpu-02"]}, "leaf-b": {"gpu": ["gpu-03", "gpu-04"]}},
        "pod-2": {"leaf-c": {"spares": ["gpu-05"]}},
    }
    groups = [g for p in view["pods"] for lf in p["leaves"] for g in lf["groups"]]
    tiles = {t["node"]: t for g in groups for t in g["tiles"]}
    assert {n: t["state"] for n, t in tiles.items()} == {
        "gpu-01": "in_service",
        "gpu-02": "quarantined",
        "gpu-03": "quarantined",  # drained by a human, not by an incident
        "gpu-04": "in_service",
        "gpu-05": "spare",
    }
    assert tiles["gpu-02"]["fault"] == "XID_79" and tiles["gpu-02"]["gpus"] == 8
    assert view["guard"] == {
        "running": True, "breaker": "closed", "breaker_detail": "", "spares": ["gpu-05"],
        "repairing": [], "queued": 0, "max_concurrent_repairs": 2,
        "floor_detail": "", "held_at_floor": [],
    }  # fmt: skip
    page = (await http.get("/ui/topology")).text
    assert 'class="tile state-quarantined" href="/ui/nodes/gpu-02" data-node="gpu-02"' in page
    assert page.index('data-pod="pod-1"') < page.index('data-leaf="leaf-a"') < page.index(
        'data-node="gpu-01"'
    ) < page.index('data-leaf="leaf-b"') < page.index('data-pod="pod-2"')  # fmt: skip


def test_an_incident_tile_says_what_the_incident_is_doing() -> None:
    approval = Waiting(kind="approval", step="reboot", since=T0)
    cases = {
        "waiting_approval": incident("gpu-01", step="approval", waiting=approval),
        "repairing": incident("gpu-01", step="repair"),
        "quarantined": incident("gpu-01", step="health_gate"),
    }
    slurm = SlurmNode(name="gpu-01", state="idle", state_flags=["DRAIN"])
    for want, inc in cases.items():
        assert topology.node_state(slurm, inc, None)[0] == want
    assert topology.node_state(None, None, None)[0] == "failed"
    down = SlurmNode(name="gpu-01", state="down", state_flags=["NOT_RESPONDING"])
    assert topology.node_state(down, None, None)[0] == "failed"
    left = SlurmNode(name="gpu-01", state="idle", state_flags=["DRAIN"], reason="autoclusters: x")
    assert topology.node_state(left, None, None)[0] == "failed"  # left drained for a human
    held = incident("gpu-01", step="release_lemon", waiting=approval).model_copy(
        update={"lemon": True}
    )
    assert topology.node_state(slurm, held, None) == (
        "waiting_approval",
        "lemon: repaired too often, held until an approver says",
    )


def test_topology_conf_round_trips_placements() -> None:
    placements = [
        Placement(node="gpu-01", pod="p1", leaf="l1"),
        Placement(node="gpu-02", pod="p2", leaf="l2"),
        Placement(node="gpu-03"),
    ]
    parsed = topology.parse_topology_conf(render_topology(placements))
    assert {n: (t.pod, t.leaf) for n, t in parsed.items()} == {
        "gpu-01": ("p1", "l1"),
        "gpu-02": ("p2", "l2"),
        "gpu-03": ("root", "unplaced"),
    }


async def test_the_incident_page_lists_its_timeline(http: httpx.AsyncClient) -> None:
    await login(http)
    page = (await http.get("/ui/incidents/inc-20261130-120000-gpu-02")).text
    for step in ("guard_register", "notify_opened", "drain"):
        assert f'data-step="{step}"' in page
    assert "1.0 s" in page and "(running)" in page
    assert (
        'href="http://temporal.example:8233/namespaces/default/workflows/remediation-c1-gpu-02"'
        in page
    )
    assert "<code>xid=79</code>" in page
    missing = await http.get("/ui/incidents/inc-20261130-120000-gpu-09")
    assert missing.status_code == 404


async def test_the_notifications_feed_lists_what_was_sent(http: httpx.AsyncClient) -> None:
    await login(http)
    feed = (await http.get("/ui/api/notifications")).json()["notifications"]
    assert [(n["event"], n["outcome"], n["node"]) for n in feed] == [("opened", "ok", "gpu-02")]
    assert ">opened<" in (await http.get("/ui/notifications")).text


async def test_the_node_page_says_when_no_prometheus_is_configured(
    http: httpx.AsyncClient,
) -> None:
    await login(http)
    page = await http.get("/ui/nodes/gpu-02")
    assert page.status_code == 200
    assert "no Prometheus configured" in page.text
    assert "inc-20261130-120000-gpu-02" in page.text and "IDLE+DRAIN" in page.text
    metrics = (await http.get("/ui/api/nodes/gpu-02/metrics")).json()
    assert metrics == {"configured": False, "prometheus_url": None, "error": None, "range": "1h",
                       "start": None, "end": None, "metrics": []}  # fmt: skip
    bad = await http.get("/ui/api/nodes/gpu-02/metrics?range=2d")
    assert bad.status_code == 400 and "range: one of 1h, 6h, 24h" in bad.json()["detail"]
    # The charts mark the node's incidents: when each opened and (if it did) closed.
    node = (await http.get("/ui/api/nodes/gpu-02")).json()
    assert node["marks"] == [{"id": "inc-20261130-120000-gpu-02", "fault": "XID_79",
                              "opened": T0.timestamp(), "closed": None}]  # fmt: skip
    page = (await http.get("/ui/nodes/gpu-02")).text
    assert "data-marks='[{" in page and "/ui/static/uplot-1.6.32.min.js" in page
    assert (await http.get("/ui/nodes/gpu-77")).status_code == 404


async def test_node_metrics_come_from_prometheus_query_range() -> None:
    asked: list[str] = []

    def prom(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        asked.append(query)
        if not query.startswith("DCGM_FI_DEV_GPU_UTIL"):
            return httpx.Response(200, json={"status": "success", "data": {"result": []}})
        series = [
            {"metric": {"gpu": str(g), "Hostname": "gpu-02"}, "values": [[100, "1"], [130, "2.5"]]}
            for g in (1, 0)
        ]
        return httpx.Response(200, json={"status": "success", "data": {"result": series}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(prom)) as client:
        got = await prometheus.node_metrics(client, "http://prom:9090/", 'gpu-"02', now=4000)
    assert asked[0] == 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-\\"02"}'  # the name stays a string
    assert [(c.metric, c.gpu, c.points) for c in got.charts] == [
        ("DCGM_FI_DEV_GPU_UTIL", "0", [(100.0, 1.0), (130.0, 2.5)]),
        ("DCGM_FI_DEV_GPU_UTIL", "1", [(100.0, 1.0), (130.0, 2.5)]),
    ]
    # One chart per metric, every GPU a series on the same times.
    [util] = got.metrics
    assert (util.metric, util.unit, util.times) == ("DCGM_FI_DEV_GPU_UTIL", "%", [100.0, 130.0])
    assert [(s.gpu, s.values) for s in util.series] == [("0", [1.0, 2.5]), ("1", [1.0, 2.5])]


async def test_a_chart_spans_the_range_asked_and_a_missing_value_is_a_gap() -> None:
    asked: list[dict[str, str]] = []

    def prom(request: httpx.Request) -> httpx.Response:
        asked.append(dict(request.url.params))
        if not request.url.params["query"].startswith("DCGM_FI_DEV_GPU_TEMP"):
            return httpx.Response(200, json={"status": "success", "data": {"result": []}})
        series = [
            {"metric": {"gpu": "0"}, "values": [[100, "40"], [190, "41"]]},
            {"metric": {"gpu": "1"}, "values": [[190, "60"]]},  # no sample at 100
        ]
        return httpx.Response(200, json={"status": "success", "data": {"result": series}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(prom)) as client:
        got = await prometheus.node_metrics(client, "http://p", "gpu-01", now=90000, span="6h")
    assert asked[0]["start"] == str(90000 - 6 * 3600) and asked[0]["step"] == "90"
    assert (got.range, got.start, got.end) == ("6h", 90000.0 - 6 * 3600, 90000.0)
    [temp] = got.metrics
    assert temp.unit == "°C" and temp.times == [100.0, 190.0]
    assert [(s.gpu, s.values) for s in temp.series] == [("0", [40.0, 41.0]), ("1", [None, 60.0])]
    with pytest.raises(ValueError, match="range"):
        await prometheus.node_metrics(client, "http://p", "gpu-01", span="7d")

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    async with httpx.AsyncClient(transport=httpx.MockTransport(down)) as client:
        failed = await prometheus.node_metrics(client, "http://prom:9090", "gpu-02")
    assert failed.configured and failed.error and "connection refused" in failed.error


# --- `autoclusters console` -------------------------------------------------------------


def test_console_url_prefers_the_public_url_then_the_bound_address() -> None:
    from autoclusters.clients.cli.console import console_url

    assert console_url("https://ops.example/", "127.0.0.1", 8480) == "https://ops.example/ui/"
    assert console_url(None, "127.0.0.1", 17207) == "http://127.0.0.1:17207/ui/"
    assert console_url(None, "0.0.0.0", 8480) == "http://127.0.0.1:8480/ui/"
    assert console_url(None, "::1", 8480) == "http://[::1]:8480/ui/"


def test_the_console_command_prints_the_configured_apis_url(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from autoclusters.clients.cli.app import app

    config = tmp_path / "autoclusters.toml"
    config.write_text('api_port = 17207\napi_tokens = { agent = "agent-token-0123456" }\n')
    monkeypatch.setenv("AUTOCLUSTERS_CONFIG", str(config))
    result = CliRunner().invoke(app, ["console"])
    assert result.exit_code == 0, result.output
    assert "http://127.0.0.1:17207/ui/" in result.stdout.splitlines()


def test_a_node_lent_to_inference_or_moving_has_its_own_tile_state() -> None:
    from autoclusters.core.sharing import LENT_REASON, move_reason

    lent = SlurmNode(name="gpu-02", state="idle", state_flags=["DRAIN"], reason=LENT_REASON)
    assert topology.node_state(lent, None, None)[0] == "lent"
    moving = SlurmNode(
        name="gpu-02", state="mixed", state_flags=["DRAIN"], reason=move_reason("c-move-3")
    )
    assert topology.node_state(moving, None, None) == (
        "moving",
        f"GPU sharing: move c-move-3, {moving.display_state} in Slurm",
    )
    # An incident on a lent node is the incident's tile, not the pool's.
    inc = incident("gpu-02", step="repair")
    assert topology.node_state(lent, inc, None)[0] == "repairing"
    assert topology.STATE_LABELS["lent"] == "lent to inference"
