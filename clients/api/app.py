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
The console (clients/console, /ui) is not the API's: clients/server.py serves it beside
these, in the app that `autoclusters api run` serves.
Slack's Approve / Reject clicks (signed by Slack): POST /slack/interactions
GPU sharing's Alertmanager webhook: POST /v1/alerts/sharing

One router per concern in routes/ (alerts, agent, incidents, health, metrics, sharing,
slack); what they share is state.py (`app.state.api`), checks.py and errors.py.

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

from fastapi import FastAPI

from autoclusters.clients.api.errors import ApiError, answer_refusal
from autoclusters.clients.api.plain_routes import serve_plainly
from autoclusters.clients.api.routes import (
    agent,
    alerts,
    health,
    incidents,
    metrics,
    sharing,
    slack,
)
from autoclusters.clients.api.state import ApiState, inventory_for
from autoclusters.clients.api.temporal_gate import ClientFactory
from autoclusters.clients.api.timing import RequestTimer
from autoclusters.clients.inventory import NodeInventory
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.integrations import temporal


def create_app(
    settings: ApiSettings,
    client_factory: ClientFactory | None = None,
    inventory: NodeInventory | None = None,
) -> FastAPI:
    """The API for one cluster. `client_factory` connects to Temporal (default: the
    settings' address); `inventory` says which nodes exist (default: per settings)."""
    api = ApiState(
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
    app.exception_handler(ApiError)(answer_refusal)
    app.add_middleware(RequestTimer, metrics=api.metrics)

    # The order routes are matched in, and listed in the OpenAPI document.
    webhooks = [alerts.router(api), agent.router(api)]
    app.include_router(sharing.router(api))
    for router in webhooks:
        app.include_router(router)
    app.include_router(incidents.router(api))
    app.include_router(health.router(api))
    app.include_router(metrics.router(api))
    if settings.slack is not None and settings.slack.signing_secret is not None:
        app.include_router(slack.router(api, settings.slack))
    # The alert webhooks skip FastAPI's per-request machinery (plain_routes.py says why).
    serve_plainly(app, webhooks, {alerts.PATH, agent.PATH})
    return app
