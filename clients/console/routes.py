"""The console's routes under /ui: pages (Jinja2, autoescaped), the JSON they poll, and
their static files. Read-only: every route is a GET, except logging in and out.

Every route needs a session cookie or the bearer header (session.py). Without one, a page
answers 401 with the login form as its body, anything else 401 JSON: `curl` without
credentials gets 401 everywhere, a browser sees where to log in.
"""

from __future__ import annotations

import asyncio
import gzip
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

import httpx
import jinja2
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from starlette.datastructures import MutableHeaders
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autoclusters.clients.clusters import ui_link
from autoclusters.clients.console import fleet, job_steps, prometheus, systemic, topology, views
from autoclusters.clients.console.cluster_read import ClusterRead, read_cluster, read_or_note
from autoclusters.clients.console.ladder import ladder_view
from autoclusters.clients.console.session import COOKIE, COOKIE_PATH, NotLoggedIn, Sessions
from autoclusters.clients.console.shared_read import ReadUnavailable, SharedRead, Snapshot
from autoclusters.clients.console.sources import ConsoleSource
from autoclusters.clients.incident_history import LADDER_HISTORY
from autoclusters.clients.incidents import IncidentNotFound, SystemicIncidentFound
from autoclusters.clients.web.auth import Unauthorized
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.policy import Policy
from autoclusters.core.slack_config import SLACK_API_URL

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
POLL_MS = 2000
# What a page shows may be this old before it says it is stale: five polls. A read that
# takes longer is abandoned and the next one starts.
MAX_AGE_S = 10.0
IDLE_S = 10.0  # no request for this long: the shared read stops
TOPOLOGY_POLL = "/ui/api/topology"
FLEET_INCIDENTS = 2000  # the fleet page reads at most this many recent incidents
GZIP_ABOVE = 2048  # bytes: smaller answers go as they are
SECURITY_HEADERS = {
    # No inline script, nothing from elsewhere: the console works air-gapped and an
    # escaped-but-odd value can never run.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def when(t: datetime | str | None) -> str:
    """A time as the pages show it (UTC, to the second); JSON times are ISO strings."""
    if isinstance(t, datetime):
        return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(t).replace("T", " ")[:19] if t else ""


def place(name: str, kind: str) -> str:
    """A pod's or leaf's heading: "pod a", but "pod-1" rather than "pod pod-1"."""
    return name if name.lower().startswith(kind) else f"{kind} {name}"


def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = when
    env.filters["place"] = place
    return Jinja2Templates(env=env)


class Console:
    """What the routes share: settings, where data comes from, sessions, templates."""

    def __init__(
        self,
        *,
        settings: ApiSettings,
        source: ConsoleSource,
        sessions: Sessions,
        policy: Callable[[], Policy],
        http: httpx.AsyncClient | None = None,
        fresh_s: float = POLL_MS / 1000,
        max_age_s: float = MAX_AGE_S,
    ) -> None:
        self.settings = settings
        self.source = source
        self.sessions = sessions
        self.policy = policy
        self.http = http or httpx.AsyncClient(timeout=5, trust_env=False)
        self.templates = templates()
        # One read of the cluster per poll interval, whoever is looking (shared_read.py).
        self.shared: SharedRead[ClusterRead] = SharedRead(
            self._read_cluster,
            fresh_s=fresh_s,
            max_age_s=max_age_s,
            timeout_s=max_age_s,
            idle_s=max(IDLE_S, 3 * fresh_s),
        )

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def _read_cluster(self) -> ClusterRead:
        before = self.shared.latest()
        return await read_cluster(
            cluster=self.settings.cluster,
            source=self.source,
            policy=self.policy,
            previous=before.value if before else None,
            stale_after_s=self.shared.max_age_s,
        )

    async def cluster_read(self) -> Snapshot[ClusterRead]:
        """The cluster as every viewer sees it now: the shared read (shared_read.py)."""
        try:
            return await self.shared.get()
        except ReadUnavailable as e:
            view = topology.build(
                cluster=self.settings.cluster, now=self.now(), slurm_nodes=[], node_sets={},
                placements={}, open_incidents=[], guard=None, errors=[f"cluster: {e}"],
            )  # fmt: skip
            view.stale_after_s = self.shared.max_age_s
            read = ClusterRead(view=view, body=topology.to_json(view)[0])
            now = self.now()
            return Snapshot(value=read, seq=0, started=0, read_at=now, took_s=0, stale=True)

    async def node(self, name: str) -> dict[str, Any]:
        snap = await self.cluster_read()
        read = snap.value
        placed = read.place(name)
        tile = placed[0] if placed else None
        errors = list(read.view.errors)
        slurm = read.slurm.get(name)
        found, k8s, steps = await asyncio.gather(
            read_or_note(
                "incidents", partial(self.source.incidents, node=name, state=None, limit=20), errors
            ),
            read_or_note("Kubernetes", partial(self.source.kubernetes_node, name), errors),
            job_steps.read_steps(
                self.http,
                self.settings.monitoring.prometheus_url,
                list(read.open_incidents),
                node=name,
            ),
        )
        return {
            "node": name,
            "known": tile is not None,
            "tile": tile.model_dump(mode="json") if tile else None,
            "pod": placed[1] if placed else "",
            "leaf": placed[2] if placed else "",
            "node_set": placed[3] if placed else "",
            "slurm": {
                "state": slurm.display_state,
                "reason": slurm.reason,
                "gres": slurm.gres,
                "slurmd_start_time": slurm.slurmd_start_time,
            }
            if slurm
            else None,
            "kubernetes": k8s,
            "kubernetes_configured": self.settings.kubernetes.kubeconfig is not None,
            "incidents": [i.model_dump(mode="json") for i in found or []],
            # Where the charts mark the node's incidents (epoch s; closed None: still open).
            "marks": [
                {
                    "id": i.incident_id,
                    "fault": i.fault,
                    "opened": i.started_at.timestamp(),
                    "closed": i.closed_at.timestamp() if i.closed_at else None,
                }
                for i in found or []
                if i.started_at
            ],
            "prometheus_configured": bool(self.settings.monitoring.prometheus_url),
            # The training jobs on it: step time per rank, the hung or slow rank marked.
            "steps": steps.model_dump(mode="json"),
            "read_at": snap.read_at.isoformat(),
            "errors": errors,
        }

    async def job(self, job_id: str) -> dict[str, Any]:
        """One training job's ranks on every node: step time, the hung or slow one marked."""
        snap = await self.cluster_read()
        steps = await job_steps.read_steps(
            self.http,
            self.settings.monitoring.prometheus_url,
            list(snap.value.open_incidents),
            job=job_id,
        )
        known = bool(steps.jobs)
        return {
            "job": job_id,
            "known": known,
            "steps": steps.model_dump(mode="json"),
            "prometheus_configured": bool(self.settings.monitoring.prometheus_url),
            "read_at": snap.read_at.isoformat(),
            "errors": [*snap.value.view.errors, *([steps.error] if steps.error else [])],
        }

    async def incidents(self) -> views.IncidentsPage:
        errors: list[str] = []
        open_, recent = await asyncio.gather(
            read_or_note(
                "incidents",
                partial(self.source.incidents, node=None, state="open", limit=200),
                errors,
            ),
            read_or_note(
                "incidents", partial(self.source.incidents, node=None, state=None, limit=50), errors
            ),
        )
        return views.IncidentsPage(open=open_ or [], recent=recent or [], errors=errors)

    async def incident(self, incident_id: str) -> views.IncidentPage:
        read = await self.source.incident(incident_id)
        slack_url, thread = self._slack_thread(incident_id)
        return views.incident_page(
            read.state,
            workflow_id=read.workflow_id,
            temporal_status=read.temporal_status,
            temporal_url=ui_link(self.settings, read.workflow_id),
            now=self.now(),
            slack_url=slack_url,
            slack_thread=thread,
        )

    async def systemic(self, incident_id: str) -> systemic.SystemicPage:
        read = await self.source.systemic(incident_id)
        temporal_url = ui_link(self.settings, read.workflow_id)
        return systemic.page(read, temporal_url=temporal_url, now=self.now())

    def _slack_thread(self, incident_id: str) -> tuple[str | None, str | None]:
        slack = self.settings.slack
        if slack is None or slack.store_dir is None:
            return None, None
        from autoclusters.integrations.slack import FileThreadStore

        rec = FileThreadStore(slack.store_dir).get(incident_id)
        if rec is None:
            return None, None
        if slack.base_url == SLACK_API_URL:  # real Slack: its permalink form
            return f"https://slack.com/archives/{rec.channel}/p{rec.ts.replace('.', '')}", None
        return None, f"channel {rec.channel}, thread {rec.ts}"

    async def fleet(self, span: str) -> fleet.FleetView:
        """The fleet page's figures over `span` (1d, 7d, 30d); ValueError for another."""
        if span not in fleet.RANGES:
            raise ValueError(f"range: one of {', '.join(fleet.RANGES)}, not {span!r}")
        errors: list[str] = []
        snap, states, figures, open_systemic = await asyncio.gather(
            self.cluster_read(),
            read_or_note("incidents", partial(self.source.recent_states, FLEET_INCIDENTS), errors),
            read_or_note("repair ladder", self.source.ladder, errors),
            read_or_note("systemic incidents", self.source.systemic_incidents, errors),
        )
        tiles = [t for p in snap.value.view.pods for lf in p.leaves for g in lf.groups
                 for t in g.tiles]  # fmt: skip
        gpus = Counter(t.gpus for t in tiles if t.gpus).most_common(1)
        if states is not None and len(states) >= FLEET_INCIDENTS:
            errors.append(f"only the latest {FLEET_INCIDENTS} incidents are counted")
        view = fleet.figures(
            states or [],
            span=span,
            now=self.now(),
            nodes=len(tiles),
            gpus_per_node=gpus[0][0] if gpus else 8,
            errors=[*snap.value.view.errors, *errors],
        )
        if figures is not None:
            view.ladder = ladder_view(figures, self.policy(), LADDER_HISTORY.days)
        # None: the read failed (its error is on the page), not "no systemic incident".
        view.systemic = [systemic.summary(x) for x in open_systemic or []]
        view.systemic_known = open_systemic is not None
        return view

    async def notifications(self) -> views.NotificationsPage:
        errors: list[str] = []
        states = await read_or_note("incidents", partial(self.source.recent_states, 30), errors)
        return views.NotificationsPage(notifications=views.feed(states or []), errors=errors)


def _console(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


async def _require(request: Request) -> str:
    # Async: a plain def would send every poll through the thread pool and back.
    return _console(request).sessions.caller(request)


def _safe_next(target: str | None) -> str:
    # Only back into the console: never an open redirect to another site.
    if target and target.startswith("/ui") and not target.startswith("//"):
        return target
    return "/ui/topology"


def _page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
    c = _console(request)
    base = {"cluster": c.settings.cluster, "poll_ms": POLL_MS, "page": name.removesuffix(".html")}
    page = c.templates.TemplateResponse(request, name, {**base, **context}, status_code=status)
    if len(page.body) <= GZIP_ABOVE or not _accepts_gzip(request):
        return page
    # A topology of 2,000 nodes is ~300 KB of HTML and ~20 KB gzipped.
    return Response(gzip.compress(bytes(page.body), compresslevel=1), status_code=status,
                    media_type="text/html; charset=utf-8",
                    headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"})  # fmt: skip


def _accepts_gzip(request: Request) -> bool:
    return "gzip" in request.headers.get("accept-encoding", "").lower()


def _staleness(snap: Snapshot[Any]) -> list[str]:
    """What a page says about how old its data is, when that matters."""
    why = f" ({snap.last_error})" if snap.last_error else ""
    if not snap.seq:  # no read at all: the view's errors say why
        return []
    if snap.stale:
        return [f"stale: the data is {snap.age_s:.0f} s old{why}"]
    return [f"the last read failed, showing the one before{why}"] if snap.last_error else []


def login_page(request: Request, *, error: str = "", status: int = 401) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    nxt = _safe_next(request.query_params.get("next") or target)
    configured = _console(request).sessions.configured
    return _page(request, "login.html", status, error=error, next=nxt, configured=configured)


async def topology_answer(console: Console, request: Request) -> Response:
    """The topology poll: the shared read's JSON as encoded once for every viewer. `Age`:
    how old it is (seconds; past the body's `stale_after_s` it is stale); `ETag`: a hash of
    what it shows, so a poll with `If-None-Match` gets 304 while the cluster is as it last
    saw it; gzipped for a caller that takes it."""
    snap = await console.cluster_read()
    headers = {"Age": str(int(snap.age_s)), "Vary": "Accept-Encoding"}
    if snap.last_error:
        headers["X-Console-Read-Error"] = snap.last_error.encode("ascii", "replace").decode()
    if snap.value.etag:
        headers["ETag"] = f'"{snap.value.etag}"'
        if request.headers.get("if-none-match") == headers["ETag"]:
            return Response(status_code=304, headers=headers)
    read = snap.value
    if _accepts_gzip(request) and read.gzipped:
        headers["Content-Encoding"] = "gzip"
        return Response(read.gzipped, media_type="application/json", headers=headers)
    return Response(read.body, media_type="application/json", headers=headers)


def router() -> APIRouter:
    open_routes = APIRouter()
    r = APIRouter(dependencies=[Depends(_require)])

    @open_routes.get("/ui/login", include_in_schema=False)
    async def login_form(request: Request) -> Response:
        return login_page(request, status=200)

    @open_routes.post("/ui/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        form = parse_qs((await request.body())[:8192].decode(errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        nxt = _safe_next((form.get("next") or [""])[0])
        c = _console(request)
        try:
            _caller, cookie = c.sessions.login(token)
        except Unauthorized as e:
            return login_page(request, error=str(e))
        answer = RedirectResponse(nxt, status_code=303)
        answer.set_cookie(
            COOKIE,
            cookie,
            max_age=c.sessions.lifetime_s,
            path=COOKIE_PATH,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    @open_routes.post("/ui/logout", include_in_schema=False)
    async def logout() -> Response:
        answer = RedirectResponse("/ui/login", status_code=303)
        answer.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
        return answer

    @r.get("/ui", include_in_schema=False)
    @r.get("/ui/", include_in_schema=False)
    async def home() -> Response:
        return RedirectResponse("/ui/topology", status_code=303)

    @r.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            return JSONResponse({"error": "not found"}, status_code=404)
        return FileResponse(path)

    @r.get("/ui/topology", include_in_schema=False)
    async def topology_page(request: Request) -> Response:
        snap = await _console(request).cluster_read()
        view = snap.value.view
        errors = [*view.errors, *_staleness(snap)]
        answer = _page(request, "topology.html", view=view, api="/ui/api/topology",
                       errors=errors, age_s=round(snap.age_s), stale=snap.stale)  # fmt: skip
        answer.headers["Age"] = str(int(snap.age_s))
        return answer

    @r.get(
        "/ui/api/topology",
        summary="Console: the topology page's data",
        response_model=topology.TopologyView,
    )
    async def topology_json(request: Request) -> Response:
        return await topology_answer(_console(request), request)

    @r.get("/ui/nodes/{node}", include_in_schema=False)
    async def node_page(request: Request, node: str) -> Response:
        data = await _console(request).node(node)
        status = 200 if data["known"] else 404
        api = f"/ui/api/nodes/{quote(node, safe='')}"
        return _page(request, "node.html", status, data=data, api=api, errors=data["errors"])

    @r.get("/ui/api/nodes/{node}", summary="Console: one node's data")
    async def node_json(request: Request, node: str) -> JSONResponse:
        data = await _console(request).node(node)
        return JSONResponse(data, status_code=200 if data["known"] else 404)

    @r.get(
        "/ui/api/nodes/{node}/metrics",
        summary="Console: a node's GPU metrics over ?range=1h|6h|24h (default 1h)",
        response_model=prometheus.NodeMetrics,
    )
    async def node_metrics(request: Request, node: str, range: str = "1h") -> Response:
        c = _console(request)
        try:
            got = await prometheus.node_metrics(
                c.http, c.settings.monitoring.prometheus_url, node, span=range
            )
        except ValueError as e:
            return JSONResponse({"error": "bad request", "detail": str(e)}, status_code=400)
        # The per-GPU `charts` stay out: `metrics` holds the same values, one chart a metric.
        return JSONResponse(got.model_dump(mode="json", exclude={"charts"}))

    @r.get("/ui/jobs/{job_id}", include_in_schema=False)
    async def job_page(request: Request, job_id: str) -> Response:
        data = await _console(request).job(job_id)
        api = f"/ui/api/jobs/{quote(job_id, safe='')}"
        status = 200 if data["known"] else 404
        return _page(request, "job.html", status, data=data, api=api, errors=data["errors"])

    @r.get("/ui/api/jobs/{job_id}", summary="Console: one training job's ranks")
    async def job_json(request: Request, job_id: str) -> JSONResponse:
        data = await _console(request).job(job_id)
        return JSONResponse(data, status_code=200 if data["known"] else 404)

    @r.get("/ui/incidents", include_in_schema=False)
    async def incidents_page(request: Request) -> Response:
        view = await _console(request).incidents()
        return _page(
            request, "incidents.html", view=view, api="/ui/api/incidents", errors=view.errors
        )

    @r.get("/ui/api/incidents", summary="Console: open and recent incidents")
    async def incidents_json(request: Request) -> views.IncidentsPage:
        return await _console(request).incidents()

    @r.get("/ui/incidents/{incident_id}", include_in_schema=False)
    async def incident_page(request: Request, incident_id: str) -> Response:
        try:
            view = await _console(request).incident(incident_id)
        except SystemicIncidentFound:
            return RedirectResponse(f"/ui/systemic/{quote(incident_id, safe='')}", 303)
        except IncidentNotFound as e:
            return _page(request, "missing.html", 404, what=str(e))
        api = f"/ui/api/incidents/{quote(incident_id, safe='')}"
        return _page(request, "incident.html", view=view, api=api)

    @r.get("/ui/api/incidents/{incident_id}", summary="Console: one incident's timeline")
    async def incident_json(request: Request, incident_id: str) -> Response:
        try:
            view = await _console(request).incident(incident_id)
        except SystemicIncidentFound:
            return RedirectResponse(f"/ui/api/systemic/{quote(incident_id, safe='')}", 303)
        except IncidentNotFound as e:
            return JSONResponse({"error": "not found", "detail": str(e)}, status_code=404)
        return JSONResponse(view.model_dump(mode="json"))

    @r.get("/ui/systemic/{incident_id}", include_in_schema=False)
    async def systemic_page(request: Request, incident_id: str) -> Response:
        try:
            view = await _console(request).systemic(incident_id)
        except IncidentNotFound as e:
            return _page(request, "missing.html", 404, what=str(e))
        api = f"/ui/api/systemic/{quote(incident_id, safe='')}"
        return _page(request, "systemic.html", view=view, api=api)

    @r.get(
        "/ui/api/systemic/{incident_id}",
        summary="Console: one systemic incident: its members, hand-off and steps",
        response_model=systemic.SystemicPage,
    )
    async def systemic_json(request: Request, incident_id: str) -> Response:
        try:
            view = await _console(request).systemic(incident_id)
        except IncidentNotFound as e:
            return JSONResponse({"error": "not found", "detail": str(e)}, status_code=404)
        return JSONResponse(view.model_dump(mode="json"))

    @r.get("/ui/fleet", include_in_schema=False)
    async def fleet_page(request: Request, range: str = "7d") -> Response:
        try:
            view = await _console(request).fleet(range)
        except ValueError as e:
            return _page(request, "bad_request.html", 400, what=str(e))
        return _page(request, "fleet.html", view=view, errors=view.errors)

    @r.get(
        "/ui/api/fleet",
        summary="Console: the fleet's figures over ?range=1d|7d|30d (default 7d)",
        response_model=fleet.FleetView,
    )
    async def fleet_json(request: Request, range: str = "7d") -> Response:
        try:
            view = await _console(request).fleet(range)
        except ValueError as e:
            return JSONResponse({"error": "bad request", "detail": str(e)}, status_code=400)
        return JSONResponse(view.model_dump(mode="json"))

    @r.get("/ui/notifications", include_in_schema=False)
    async def notifications_page(request: Request) -> Response:
        view = await _console(request).notifications()
        api = "/ui/api/notifications"
        return _page(request, "notifications.html", view=view, api=api, errors=view.errors)

    @r.get("/ui/api/notifications", summary="Console: the notifications sent")
    async def notifications_json(request: Request) -> views.NotificationsPage:
        return await _console(request).notifications()

    both = APIRouter()
    both.include_router(open_routes)
    both.include_router(r)
    return both


def install(app: FastAPI, console: Console) -> None:
    """Add the console to `app`: its routes, the 401 answer, its security headers."""
    app.state.console = console
    app.include_router(router())

    @app.exception_handler(NotLoggedIn)
    async def _not_logged_in(request: Request, e: NotLoggedIn) -> Response:
        if request.url.path.startswith(("/ui/api/", "/ui/static/")):
            return JSONResponse(
                {"error": "unauthorized", "detail": str(e)},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="autoclusters"'},
            )
        return login_page(request, error="" if "log in" in str(e) else str(e))

    app.add_middleware(_SecurityHeaders)


class _SecurityHeaders:
    """SECURITY_HEADERS on every /ui answer. Plain ASGI, not `@app.middleware("http")`:
    that costs every request of the API (alerts too) a task group and memory streams."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/ui"):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for k, v in SECURITY_HEADERS.items():
                    headers.setdefault(k, v)
            await send(message)

        if scope["path"] == TOPOLOGY_POLL and scope["method"] == "GET":
            # Every open topology page asks this every 2 s: a caller with a session gets the
            # shared read's bytes here, without FastAPI's routing and dependencies (half a
            # poll's CPU). Anyone else goes the ordinary way (its 401).
            request = Request(scope, receive)
            console: Console = scope["app"].state.console
            try:
                console.sessions.caller(request)
            except NotLoggedIn:
                pass
            else:
                answer = await topology_answer(console, request)
                await answer(scope, receive, with_headers)
                return
        await self.app(scope, receive, with_headers)
