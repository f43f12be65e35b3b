"""The HTTP API (FastAPI): alerts in, incidents out.

Writes (bearer token):
  POST /v1/alerts/alertmanager   Alertmanager webhook, payload version "4"
  POST /v1/reports               one NodeReport from the node health agent
  POST /v1/health-snapshots      the agent's HealthSnapshot: forwarded to the node's open
                                 incident (the health gate's evidence); starts nothing
Reads (a token only with api_auth_reads):
  GET  /v1/incidents             ?state=&node=&fault=&limit=
  GET  /v1/incidents/{id}        the incident's timeline (the workflow's `status` query)
Always open:
  GET  /healthz, /readyz
A token, except to a loopback caller while the API binds loopback:
  GET  /metrics
The console (clients/console): /ui pages and their JSON, a login cookie or the token.

Status codes of the writes, checked in this order; a refused request starts nothing:
  401  no or wrong bearer token (checked before the body is read)
  413  body larger than api_max_body_bytes
  422  the body is not a valid payload: the answer names each bad field
       (e.g. alerts[0].startsAt); an alert that is valid but not ours (unmapped
       alertname, no node label) is not an error: it is skipped and listed in the 202
  404  a firing alert names a node the inventory does not know (api_unknown_node=reject,
       the default): the whole payload is refused and the answer names the nodes;
       with api_unknown_node=skip such alerts are skipped and listed instead
  503  Temporal (or the Slurm node list) could not be reached, or did not accept every
       alert within api_temporal_timeout_s; Retry-After says when to try again, and a
       retry repeats nothing that was accepted meanwhile
  500  anything else (Alertmanager retries it too)
  202  every firing alert is on its node's incident (opened, joined, or accepted before),
       every resolved one is recorded; the answer lists incidents and skipped alerts.
       An alert of a fault kind the node's open incident has (Temporal said so less than
       api_open_incident_ttl_s ago) is answered `joined` at once and reaches the
       incident within api_join_flush_s, batched (intake.py says what if it closed)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, NoReturn, TypeVar

from fastapi import FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from temporalio.client import (
    Client,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.clients import console, incidents
from autoclusters.clients.agent.report import (
    SNAPSHOTS_PATH,
    HealthSnapshot,
    NodeReport,
    ReportState,
)
from autoclusters.clients.api import sharing
from autoclusters.clients.api.alertmanager import (
    AlertmanagerPayload,
    FaultMap,
    MappedAlert,
    read_alerts,
)
from autoclusters.clients.api.auth import BearerAuth, Unauthorized
from autoclusters.clients.api.dedupe import DedupeStore
from autoclusters.clients.api.evidence import SnapshotAnswer, forward
from autoclusters.clients.api.intake import Delivered, Intake, Outcome, Signal, TemporalUnavailable
from autoclusters.clients.api.inventory import NodeInventory, SlurmInventory, StaticInventory
from autoclusters.clients.api.metrics import ApiMetrics
from autoclusters.clients.api.open_incidents import OpenIncidents
from autoclusters.clients.api.plain_routes import serve_plainly
from autoclusters.clients.api.resolutions import Resolution, ResolutionLog
from autoclusters.clients.api.settings import ApiSettings
from autoclusters.clients.api.timing import RequestTimer
from autoclusters.core.fault_evidence import FaultCleared, FaultEvidence
from autoclusters.core.faults import CATALOGUE_HINT, UnknownFaultError, check_known_fault
from autoclusters.core.models import IncidentState, IncidentStateName, workflow_id
from autoclusters.core.net import is_loopback
from autoclusters.core.policy import Policy, PolicyError
from autoclusters.core.settings import policy_for
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmError, UnknownNodeError

log = logging.getLogger("autoclusters.api")

ClientFactory = Callable[[], Awaitable[Client]]
M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# Temporal answers worth retrying: the server is down, busy, or cut the call short.
RETRYABLE = {
    RPCStatusCode.UNAVAILABLE,
    RPCStatusCode.DEADLINE_EXCEEDED,
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.ABORTED,
    RPCStatusCode.CANCELLED,
}


# --- answers ------------------------------------------------------------------------------


class IncidentRef(BaseModel):
    node: str
    incident_id: str
    workflow_id: str
    opened: bool  # an alert of this request opened it (else all joined an open one)


class Skipped(BaseModel):
    index: int  # position in the payload's alerts
    fingerprint: str
    alertname: str
    node: str = ""
    reason: str  # unmapped, bad_fault, no_node, unknown_node
    detail: str


class IngestAnswer(BaseModel):
    accepted: int  # firing alerts now on their node's incident (including repeats)
    deduplicated: int  # of those, accepted before: nothing new was sent
    resolved: int  # resolved alerts recorded
    skipped: list[Skipped]
    incidents: list[IncidentRef]


class IncidentList(BaseModel):
    incidents: list[incidents.IncidentSummary]


class IncidentDetail(BaseModel):
    incident_id: str
    workflow_id: str
    temporal_status: str
    incident: IncidentState
    # Resolutions of this node's faults received since the incident opened (kept by the
    # API until the workflow can record them).
    resolved_alerts: list[Resolution]


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        reason: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(body.get("detail", reason))
        self.status, self.reason, self.body, self.headers = status, reason, body, headers or {}


# --- the parts ------------------------------------------------------------------------------


class TemporalGate:
    """The Temporal client, connected on first need: the API starts (and answers 503)
    while Temporal is down, and connects once it is up. Callers that arrive while a
    connect is under way share it, so a storm against a dead address makes one attempt."""

    def __init__(self, factory: ClientFactory, address: str, timeout_s: float) -> None:
        self._factory = factory
        self._address = address
        self._timeout_s = timeout_s
        self._client: Client | None = None
        self._connecting: asyncio.Task[Client] | None = None

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def client(self) -> Client:
        if self._client is not None:
            return self._client
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.create_task(self._connect())
            self._connecting.add_done_callback(lambda t: t.cancelled() or t.exception())
        # Shielded: a caller that gives up does not cancel the others' attempt.
        return await asyncio.shield(self._connecting)

    async def _connect(self) -> Client:
        try:
            client = await asyncio.wait_for(self._factory(), self._timeout_s)
        except Exception as e:
            why = str(e) or type(e).__name__
            raise TemporalUnavailable(f"cannot reach Temporal at {self._address}: {why}") from None
        self._client = client
        return client


class PolicyCache:
    """The cluster's policy, read again when its file changes (a broken edit keeps the
    last good one, loudly)."""

    def __init__(self, settings: ApiSettings) -> None:
        self._settings = settings
        self._policy = policy_for(settings)
        self._mtime = self._stat()

    def _stat(self) -> int | None:
        path = self._settings.policy_file
        try:
            return path.stat().st_mtime_ns if path is not None else None
        except OSError:
            return None

    def current(self) -> Policy:
        mtime = self._stat()
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                self._policy = policy_for(self._settings)
            except PolicyError as e:
                log.error("policy file changed but is invalid; keeping the previous one: %s", e)
        return self._policy


def inventory_for(settings: ApiSettings) -> NodeInventory:
    if settings.api_inventory == "static":
        return StaticInventory(settings.api_nodes)
    return SlurmInventory.for_settings(settings, ttl_s=settings.api_inventory_ttl_s)


def _field_name(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(body)"


def _invalid(e: ValidationError, what: str) -> ApiError:
    problems = [
        {"field": _field_name(err["loc"]), "message": err["msg"]}
        for err in e.errors(include_url=False, include_input=False)
    ]
    fields = list(dict.fromkeys(p["field"] for p in problems))
    detail = "; ".join(f"{p['field']}: {p['message']}" for p in problems[:10])
    return ApiError(
        422,
        "invalid",
        {"error": f"invalid {what}", "fields": fields, "problems": problems, "detail": detail},
    )


def _body_schema(model: type[BaseModel]) -> dict[str, Any]:
    # The body is read by hand (auth comes first); this keeps it in the OpenAPI document.
    schema = model.model_json_schema(by_alias=True)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


class Api:
    def __init__(
        self, settings: ApiSettings, client_factory: ClientFactory, inventory: NodeInventory
    ) -> None:
        self.settings = settings
        self.inventory = inventory
        self.auth = BearerAuth(settings)
        self.faults = FaultMap(settings.alert_faults())
        self.metrics = ApiMetrics()
        self.resolutions = ResolutionLog()
        self.policies = PolicyCache(settings)
        self.gate = TemporalGate(
            client_factory, settings.temporal_address, settings.api_temporal_timeout_s
        )
        self.intake: Intake | None = None  # made in the server's event loop

    @asynccontextmanager
    async def lifespan(self, _app: FastAPI) -> AsyncIterator[None]:
        s = self.settings
        self.intake = Intake(
            self.deliver,
            dedupe=DedupeStore[Delivered](s.api_dedupe_ttl_s, s.api_dedupe_max),
            metrics=self.metrics,
            max_in_flight=s.api_max_in_flight,
            timeout_s=s.api_temporal_timeout_s,
            open_incidents=OpenIncidents(s.api_open_incident_ttl_s),
            join_flush_s=s.api_join_flush_s,
        )
        if not self.auth.configured:
            log.warning("no api_tokens configured: every write will be refused (401)")
        try:
            yield
        finally:
            await self.intake.close()

    # --- Temporal -------------------------------------------------------------------------

    async def deliver(
        self,
        node: str,
        fault: str,
        source: str,
        key: str,
        evidence: FaultEvidence | None,
        at: datetime | None,
    ) -> incidents.OpenedIncident:
        client = await self.gate.client()
        try:
            return await incidents.open_incident(
                client,
                self.settings,
                node,
                fault,
                opened_by=source,
                policy=self.policies.current(),
                inventory=self.inventory,
                key=key,
                evidence=evidence,
                at=at,
            )
        except RPCError as e:
            if e.status in RETRYABLE:
                raise TemporalUnavailable(f"Temporal: {e.message}") from None
            if _not_ready(e):  # its last workflow task failed; the worker retries it
                raise TemporalUnavailable(f"Temporal: {e.message}", kind="not_ready") from None
            raise
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            raise TemporalUnavailable("Temporal did not answer in time", kind="timeout") from None
        except WorkflowUpdateFailedError as e:
            # The open incident refused the report: it is closing. A retry opens a new one.
            raise TemporalUnavailable(
                f"the incident on {node} is closing ({e.cause or e}); retry", kind="closing"
            ) from None
        except UnknownNodeError:
            raise
        except SlurmError as e:  # the node list could not be read: retry later
            raise TemporalUnavailable(f"Slurm: {e}", kind="inventory") from None

    def refuse_unknown_faults(self, faults: list[tuple[str, str]], endpoint: str) -> None:
        """422 naming every unknown fault kind and the field it was in, in one line that
        points at the catalogue (`autoclusters faults`) rather than listing it."""
        known = self.policies.current().faults
        bad = []
        for where, fault in faults:
            try:
                check_known_fault(fault, known)
            except UnknownFaultError:
                bad.append((where, fault))
        if bad:
            kinds = sorted({f for _, f in bad})
            fields = [w for w, _ in bad]
            shown = ", ".join(repr(k[:64]) for k in kinds[:10])
            _raise(
                self.refuse(
                    422,
                    "unknown_fault",
                    endpoint,
                    "unknown fault kind",
                    f"unknown fault kind {shown} ({', '.join(fields[:10])}): "
                    f"{CATALOGUE_HINT}; nothing was started",
                    faults=kinds,
                    fields=fields,
                )  # fmt: skip
            )

    async def clear(self, node: str, cleared: FaultCleared, endpoint: str) -> bool:
        """Record on the node's open incident that a fault cleared (never starts one)."""
        try:
            client = await self.gate.client()
            return await incidents.record_cleared(client, self.settings, node, cleared)
        except RPCError as e:
            if e.status in RETRYABLE:
                down = TemporalUnavailable(f"Temporal: {e.message}")
                raise self.unavailable(down, endpoint) from None
            raise
        except TemporalUnavailable as e:
            raise self.unavailable(e, endpoint) from None

    def unavailable(self, e: Exception, endpoint: str) -> ApiError:
        self.metrics.requests_refused.labels(endpoint, "temporal_unavailable").inc()
        retry = self.settings.api_retry_after_s
        return ApiError(
            503,
            "temporal_unavailable",
            {"error": "temporarily unavailable", "detail": str(e), "retry_after_s": retry},
            {"Retry-After": str(retry)},
        )

    async def submit(self, signals: list[Signal], endpoint: str) -> list[Outcome]:
        assert self.intake is not None, "the API's lifespan has not started"
        if not signals:
            return []
        try:
            return await self.intake.submit(signals)
        except TemporalUnavailable as e:
            raise self.unavailable(e, endpoint) from None
        except UnknownNodeError as e:  # Slurm dropped the node between check and start
            raise self.refuse(404, "unknown_node", endpoint, "unknown node", str(e)) from None
        except Exception as e:  # a bug or a misconfiguration (e.g. a namespace): loud, 500
            log.exception("alerts not accepted")
            raise self.refuse(500, "error", endpoint, "internal error", str(e)) from None

    async def read(self, call: Callable[[Client], Awaitable[T]], endpoint: str) -> T:
        try:
            client = await self.gate.client()
            return await asyncio.wait_for(call(client), self.settings.api_temporal_timeout_s)
        except TemporalUnavailable as e:
            raise self.unavailable(e, endpoint) from None
        except TimeoutError:
            late = TemporalUnavailable("Temporal (or a worker, for queries) did not answer in time")
            raise self.unavailable(late, endpoint) from None
        except RPCError as e:
            if e.status in RETRYABLE:
                raise self.unavailable(e, endpoint) from None
            raise

    # --- requests -------------------------------------------------------------------------

    def refuse(
        self, status: int, reason: str, endpoint: str, error: str, detail: str, **extra: Any
    ) -> ApiError:
        self.metrics.requests_refused.labels(endpoint, reason).inc()
        return ApiError(status, reason, {"error": error, "detail": detail, **extra})

    def authorize(self, request: Request, endpoint: str, *, write: bool = True) -> str:
        if not write and not self.settings.api_auth_reads:
            return "anonymous"
        try:
            return self.auth.caller(request.headers.get("authorization"))
        except Unauthorized as e:
            err = self.refuse(401, "unauthorized", endpoint, "unauthorized", str(e))
            err.headers["WWW-Authenticate"] = 'Bearer realm="autoclusters"'
            raise err from None

    async def body(self, request: Request, model: type[M], what: str, endpoint: str) -> M:
        limit = self.settings.api_max_body_bytes

        def too_large() -> ApiError:
            detail = f"more than {limit} bytes"
            return self.refuse(413, "too_large", endpoint, "payload too large", detail)

        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large()
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > limit:
                raise too_large()
        try:
            return model.model_validate_json(bytes(raw))
        except ValidationError as e:
            self.metrics.requests_refused.labels(endpoint, "invalid").inc()
            raise _invalid(e, what) from None

    async def known_nodes(self, names: Iterable[str], endpoint: str) -> set[str]:
        try:
            return await self.inventory.known(set(names))
        except SlurmError as e:
            raise self.unavailable(e, endpoint) from None


def answer(
    outcomes: list[Outcome], resolved: int, skipped: list[Skipped], metrics: ApiMetrics, src: str
) -> Response:
    refs: dict[str, IncidentRef] = {}
    for o in outcomes:
        ref = refs.get(o.signal.node)
        if ref is None or ref.incident_id != o.delivered.incident_id:
            refs[o.signal.node] = ref = IncidentRef(
                node=o.signal.node,
                incident_id=o.delivered.incident_id,
                workflow_id=o.delivered.workflow_id,
                opened=False,
            )
        ref.opened = ref.opened or (o.delivered.opened and not o.repeat)
    # Known here (this process accepted it), or known to the incident (another replica, or
    # this one before a restart, delivered it first).
    repeats = sum(o.repeat or o.delivered.repeat for o in outcomes)
    metrics.of(metrics.alerts_deduplicated, src).inc(repeats)
    for s in skipped:
        metrics.alerts_rejected.labels(src, s.reason).inc()
    body = IngestAnswer(
        accepted=len(outcomes),
        deduplicated=repeats,
        resolved=resolved,
        skipped=skipped,
        incidents=list(refs.values()),
    )
    # pydantic writes the JSON itself: no dict in between, no json.dumps.
    return Response(body.model_dump_json(), status_code=202, media_type="application/json")


def _not_ready(e: RPCError) -> bool:
    """The incident's workflow task failed (a worker starved of CPU missed its deadline,
    say): Temporal refuses updates until the worker's retry of the task succeeds. Seen in
    an alert storm that opened 200 incidents on a busy 2-core machine."""
    return e.status == RPCStatusCode.FAILED_PRECONDITION and (
        b"WorkflowNotReadyFailure" in (e.raw_grpc_status or b"")
    )


def _raise(err: ApiError) -> NoReturn:
    raise err


# --- the app ------------------------------------------------------------------------------


def create_app(
    settings: ApiSettings,
    client_factory: ClientFactory | None = None,
    inventory: NodeInventory | None = None,
) -> FastAPI:
    """The API for one cluster. `client_factory` connects to Temporal (default: the
    settings' address); `inventory` says which nodes exist (default: per settings)."""
    api = Api(
        settings,
        client_factory or (lambda: temporal.connect(settings)),
        inventory or inventory_for(settings),
    )
    app = FastAPI(
        title="AutoClusters API",
        summary="Alerts in (Alertmanager, node agents), incidents out.",
        lifespan=api.lifespan,
    )
    app.state.api = api

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body, status_code=e.status, headers=e.headers)

    app.add_middleware(RequestTimer, metrics=api.metrics)

    sharing.register(app, api)

    @app.post(
        "/v1/alerts/alertmanager",
        status_code=202,
        response_model=IngestAnswer,
        openapi_extra=_body_schema(AlertmanagerPayload),
        summary="Alertmanager webhook (version 4): open or join each node's incident",
    )
    async def alertmanager(request: Request) -> Response:
        ep, src = "alertmanager", "alertmanager"
        caller = api.authorize(request, ep)
        payload = await api.body(request, AlertmanagerPayload, "Alertmanager payload", ep)
        if payload.truncated_alerts:
            # Alertmanager dropped alerts from this notification (max_alerts): say so.
            api.metrics.alerts_truncated.inc(payload.truncated_alerts)
            log.warning(
                "alertmanager (%s): %d alert(s) truncated from group %s",
                caller, payload.truncated_alerts, payload.group_key[:120],
            )  # fmt: skip
        read = read_alerts(payload, api.faults)
        api.refuse_unknown_faults(
            [(f"alerts[{m.index}]", m.fault) for m in read.mapped if m.alert.status == "firing"],
            ep,
        )
        for a in payload.alerts:
            api.metrics.of(api.metrics.alerts_received, src, a.status).inc()
        skipped = [
            Skipped(
                index=s.index,
                fingerprint=s.fingerprint,
                alertname=s.alertname,
                reason=s.reason,
                detail=s.detail,
            )  # fmt: skip
            for s in read.skipped
        ]
        known = await api.known_nodes((n for m in read.mapped for n in m.node_candidates), ep)
        unknown: list[MappedAlert] = []
        for m in read.mapped:
            m.node = next((n for n in m.node_candidates if n in known), "")
            if not m.node and m.alert.status == "firing":
                unknown.append(m)
        if unknown and settings.api_unknown_node == "reject":
            names = sorted({m.node_candidates[0] for m in unknown})
            where = ", ".join(f"alerts[{m.index}]" for m in unknown[:10])
            _raise(
                api.refuse(
                    404,
                    "unknown_node",
                    ep,
                    "unknown node",
                    f"node(s) {', '.join(names)} not in cluster {settings.cluster} ({where}); "
                    "nothing was started",
                    nodes=names,
                )  # fmt: skip
            )
        for m in unknown:
            skipped.append(
                Skipped(
                    index=m.index,
                    fingerprint=m.fingerprint,
                    alertname=m.alertname,
                    node=m.node_candidates[0],
                    reason="unknown_node",
                    detail=f"node {m.node_candidates[0]} is not in cluster {settings.cluster}",
                )  # fmt: skip
            )
        firing = [m for m in read.mapped if m.alert.status == "firing" and m.node]
        resolved = 0
        now = datetime.now(UTC)
        for m in read.mapped:
            if m.alert.status == "resolved":
                ends = m.alert.ends_at
                resolved += api.resolutions.record(
                    Resolution(
                        node=m.node or m.node_candidates[0],
                        fault=m.fault,
                        source=src,
                        key=m.key,
                        started_at=m.alert.starts_at,
                        resolved_at=ends if ends and ends.year > 1 else None,
                        received_at=now,
                        detail=m.alertname,
                    )  # fmt: skip
                )
        signals = [
            Signal(
                key=m.key,
                node=m.node,
                fault=m.fault,
                source=src,
                evidence_of=partial(
                    FaultEvidence.from_alert,
                    key=m.key,
                    starts_at=m.alert.starts_at,
                    labels=m.alert.labels,
                    annotations=m.alert.annotations,
                ),
                at=m.alert.starts_at,
            )
            for m in firing
        ]
        outcomes = await api.submit(signals, ep)
        # After the firing ones: a resolution in the payload that opened the incident is
        # recorded on it too, and it lives in the incident, not in this process.
        for m in read.mapped:
            if m.alert.status == "resolved" and m.node:
                ends = m.alert.ends_at
                await api.clear(
                    m.node,
                    FaultCleared(
                        fault=m.fault,
                        source=src,
                        key=m.key,
                        starts_at=m.alert.starts_at,
                        resolved_at=ends if ends and ends.year > 1 else now,
                        detail=m.alertname,
                    ),
                    ep,
                )
        if outcomes or skipped:
            log.info(
                "alertmanager (%s): %d alerts: %d firing accepted, %d resolved, %d skipped",
                caller, len(payload.alerts), len(outcomes), resolved, len(skipped),
            )  # fmt: skip
        return answer(outcomes, resolved, skipped, api.metrics, src)

    @app.post(
        "/v1/reports",
        status_code=202,
        response_model=IngestAnswer,
        openapi_extra=_body_schema(NodeReport),
        summary="A node health agent's report: open or join the node's incident",
    )
    async def report(request: Request) -> Response:
        ep, src = "reports", "agent"
        api.authorize(request, ep)
        rep = await api.body(request, NodeReport, "NodeReport", ep)
        api.metrics.of(api.metrics.alerts_received, src, rep.state.value).inc()
        if rep.state == ReportState.FIRING:
            api.refuse_unknown_faults([("fault", rep.fault)], ep)
        known = await api.known_nodes([rep.node], ep)
        skipped: list[Skipped] = []
        if rep.node not in known:
            if settings.api_unknown_node == "reject" and rep.state == ReportState.FIRING:
                _raise(
                    api.refuse(
                        404,
                        "unknown_node",
                        ep,
                        "unknown node",
                        f"node {rep.node} is not in cluster {settings.cluster}; "
                        "nothing was started",
                        nodes=[rep.node],
                    )  # fmt: skip
                )
            if rep.state == ReportState.FIRING:
                skipped.append(
                    Skipped(
                        index=0,
                        fingerprint=rep.report_id,
                        alertname=rep.fault,
                        node=rep.node,
                        reason="unknown_node",
                        detail=f"node {rep.node} is not in cluster {settings.cluster}",
                    )  # fmt: skip
                )
        key = f"agent:{rep.report_id}"
        if rep.state == ReportState.RESOLVED:
            recorded = api.resolutions.record(
                Resolution(
                    node=rep.node,
                    fault=rep.fault,
                    source=src,
                    key=key,
                    started_at=rep.since,
                    resolved_at=rep.observed_at,
                    received_at=datetime.now(UTC),
                    detail=rep.message,
                )  # fmt: skip
            )
            if not skipped:
                await api.clear(
                    rep.node,
                    FaultCleared(
                        fault=rep.fault,
                        source=src,
                        key=key,
                        starts_at=rep.since,
                        resolved_at=rep.observed_at,
                        detail=rep.message,
                    ),
                    ep,
                )
            return answer([], int(recorded), skipped, api.metrics, src)
        evidence = FaultEvidence.from_agent(
            key=key, since=rep.since, message=rep.message, readings=rep.evidence
        )
        signals = (
            []
            if skipped
            else [
                Signal(
                    key=key,
                    node=rep.node,
                    fault=rep.fault,
                    source=src,
                    evidence=evidence,
                    at=rep.since,
                )
            ]
        )
        outcomes = await api.submit(signals, ep)
        return answer(outcomes, 0, skipped, api.metrics, src)

    @app.post(
        SNAPSHOTS_PATH,
        status_code=202,
        response_model=SnapshotAnswer,
        openapi_extra=_body_schema(HealthSnapshot),
        summary="A node agent's health snapshot: evidence for the node's open incident",
    )
    async def health_snapshot(request: Request) -> JSONResponse:
        ep = "health_snapshots"
        api.authorize(request, ep)
        snap = await api.body(request, HealthSnapshot, "HealthSnapshot", ep)
        if snap.node not in await api.known_nodes([snap.node], ep):
            detail = f"node {snap.node} is not in cluster {settings.cluster}"
            if settings.api_unknown_node == "reject":
                _raise(
                    api.refuse(
                        404,
                        "unknown_node",
                        ep,
                        "unknown node",
                        detail + "; nothing was started",
                        nodes=[snap.node],
                    )  # fmt: skip
                )
            wf_id = workflow_id(settings.cluster, snap.node)
            body = SnapshotAnswer(node=snap.node, forwarded=False, workflow_id=wf_id, detail=detail)
        else:
            try:
                body = await asyncio.wait_for(
                    forward(await api.gate.client(), settings.cluster, snap),
                    settings.api_temporal_timeout_s,
                )
            except TimeoutError:
                late = TemporalUnavailable("Temporal did not take the snapshot in time", "timeout")
                raise api.unavailable(late, ep) from None
            except TemporalUnavailable as e:
                raise api.unavailable(e, ep) from None
        return JSONResponse(body.model_dump(mode="json"), status_code=202)

    @app.get("/v1/incidents", response_model=IncidentList, summary="This cluster's incidents")
    async def list_incidents(
        request: Request,
        state: Annotated[
            IncidentStateName | None,
            Query(description="open, waiting_approval, resolved, ... (anything else: 422)"),
        ] = None,
        node: str | None = None,
        fault: str | None = None,
        limit: int = Query(100, ge=1, le=1000),
    ) -> IncidentList:
        api.authorize(request, "incidents", write=False)
        found = await api.read(
            lambda c: incidents.list_incidents(c, settings, state, node, fault, limit=limit),
            "incidents",
        )
        return IncidentList(incidents=found)

    @app.get(
        "/v1/incidents/{incident_id}",
        response_model=IncidentDetail,
        summary="One incident's timeline (the workflow's status query)",
    )
    async def get_incident(request: Request, incident_id: str) -> IncidentDetail:
        ep = "incident"
        api.authorize(request, ep, write=False)

        async def look(client: Client) -> IncidentDetail:
            handle = await incidents.find_incident(client, settings, incident_id)
            state, status = await incidents.incident_state(handle)
            assert state is not None
            node = state.request.node
            return IncidentDetail(
                incident_id=incident_id,
                workflow_id=handle.id,
                temporal_status=status,
                incident=state,
                resolved_alerts=api.resolutions.for_node(node, state.request.opened_at),
            )

        try:
            return await api.read(look, ep)
        except incidents.IncidentNotFound as e:
            raise api.refuse(404, "not_found", ep, "no such incident", str(e)) from None

    @app.get("/healthz", summary="Liveness: the process answers")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "temporal": "connected" if api.gate.connected else "not connected"}

    @app.get("/readyz", summary="Readiness: Temporal can be reached")
    async def readyz() -> dict[str, str]:
        async def check(client: Client) -> bool:
            return await client.service_client.check_health()

        if not await api.read(check, "readyz"):
            raise api.unavailable(
                TemporalUnavailable("Temporal reports itself unhealthy"), "readyz"
            )
        return {"status": "ready"}

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics(request: Request) -> Response:
        # Open to this machine while the API binds loopback (a sandbox); otherwise the
        # scraper shows a token (Prometheus: `authorization.credentials_file`).
        caller = request.client.host if request.client else None
        if not (is_loopback(settings.api_host) and is_loopback(caller)):
            api.authorize(request, "metrics")
        return Response(api.metrics.render(), media_type=api.metrics.content_type)

    if settings.slack is not None and settings.slack.signing_secret is not None:
        _slack_interactions(app, api, settings)
    console.mount(
        app, settings=settings, auth=api.auth, client=api.gate.client, policy=api.policies.current
    )
    serve_plainly(app, {"/v1/alerts/alertmanager", "/v1/reports"})
    return app


def _slack_interactions(app: FastAPI, api: Api, settings: ApiSettings) -> None:
    """`POST /slack/interactions`: Approve / Reject clicks. The Slack signature over the raw
    body is the authentication (no bearer token); the click becomes the Temporal Update:
    the incident's, or, for a button of a GPU rebalancer's move (step `move`, which no
    incident has), the cluster's rebalancer's `decide_waiting_move`. Either refusal is a
    PermissionError, which the handler shows to the clicker."""
    from autoclusters.clients.sharing import decide_move
    from autoclusters.core.sharing import MOVE_APPROVAL_STEP, MoveDecision
    from autoclusters.integrations.slack import InteractionHandler

    assert settings.slack is not None
    slack = settings.slack

    async def decide(
        *, incident_id: str, step: str, approver: str, approve: bool, comment: str = ""
    ) -> object:
        client = await api.gate.client()
        if step == MOVE_APPROVAL_STEP:
            decision = MoveDecision(move_id=incident_id, approve=approve, by=approver)
            return await decide_move(client, settings.cluster, decision)
        return await incidents.decide(
            client, settings, incident_id, approver, approve, comment, step=step
        )

    handler = InteractionHandler.from_config(slack, decide=decide)

    @app.post("/slack/interactions", summary="Slack interactivity (signed by Slack)")
    async def slack_interactions(request: Request) -> JSONResponse:
        answer = await handler.handle(await request.body(), request.headers)
        return JSONResponse(answer.body, status_code=answer.status_code)


def app_from_env() -> FastAPI:
    """For `uvicorn --factory clients.api.app:app_from_env`: settings from the environment
    and autoclusters.toml, as every entry point reads them."""
    return create_app(ApiSettings())
