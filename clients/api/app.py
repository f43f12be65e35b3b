"""The HTTP API (FastAPI): alerts in, incidents out.

Every token has a role (clients/web/tokens.py); a route opens to its roles only (403
to the others):
  POST /v1/alerts/alertmanager   alertmanager: the webhook, payload version "4"
  POST /v1/reports               agent: one NodeReport from the node health agent
  POST /v1/health-snapshots      agent: the agent's HealthSnapshot, forwarded to the node's
                                 open incident (the health gate's evidence); starts nothing
  POST /v1/incidents/{id}/decisions  operator: approve or reject, as the token's person
The provider's answer to a hand-off (signed with the shared secret, no token; docs/handoff.md):
  POST /v1/handoffs/{id}/answer  fixed, replaced or declined
Reads (reader or operator; a token only with api_auth_reads):
  GET  /v1/incidents             ?state=&node=&fault=&limit=
  GET  /v1/incidents/{id}        the incident's timeline (the workflow's `status` query)
Always open:
  GET  /healthz, /readyz
A reader's or operator's token, except to a loopback caller while the API binds loopback:
  GET  /metrics
The console (clients/console, /ui) is not the API's: clients/server.py serves it beside
these, in the app that `autoclusters api run` serves.
Slack's Approve / Reject clicks (signed by Slack): POST /slack/interactions
GPU sharing's Alertmanager webhook (alertmanager): POST /v1/alerts/sharing

One router per concern in routes/ (alerts, agent, incidents, decisions, health, metrics,
sharing, slack); what they share is state.py (`app.state.api`), checks.py and errors.py.

Status codes of the writes, checked in this order; a refused request starts nothing:
  401  no or wrong bearer token (checked before the body is read)
  403  a valid token whose role does not open the route
  413  body larger than api_max_body_bytes
  422  the body is not a valid payload: the answer names each bad field
       (e.g. alerts[0].startsAt); an alert that is valid but not ours (unmapped
       alertname, no node label) is not an error: it is skipped and listed in the 202
  404  every firing alert names a node the inventory does not know and the payload holds
       nothing else to act on (api_unknown_node=reject, the default): the answer names
       the nodes. A payload with alerts for known nodes too is a 202: those go ahead, and
       `unknown_nodes` (and `skipped`) lists the rest; with api_unknown_node=skip never 404
  503  Temporal (or the Slurm node list) could not be reached, or did not accept every
       alert within api_temporal_timeout_s; Retry-After says when to try again, and a
       retry repeats nothing that was accepted meanwhile
  500  anything else (Alertmanager retries it too)
  202  every firing alert is on its node's incident (opened, joined, or accepted before),
       every resolved one is recorded; the answer lists incidents and skipped alerts.
       An alert of a fault kind the node's open incident has (Temporal said so less than
       api_open_incident_ttl_s ago) is answered `joined` at once and reaches the
       incident within api_join_flush_s, batched (intake.py says what if it closed).
       In a storm (api_storm_nodes nodes with alerts on their way: storm.py) nothing
       waits for a worker: a new node's incident is started with its first alerts in the
       start request (`opened` once Temporal's server has it), the rest `joined`
"""

from __future__ import annotations

from fastapi import FastAPI

from autoclusters.clients.api.errors import ApiError, answer_refusal
from autoclusters.clients.api.plain_routes import serve_plainly
from autoclusters.clients.api.routes import (
    agent,
    alerts,
    decisions,
    handoffs,
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
    app.include_router(decisions.router(api))
    app.include_router(handoffs.router(api))
    app.include_router(health.router(api))
    app.include_router(metrics.router(api))
    if settings.slack is not None and settings.slack.signing_secret is not None:
        app.include_router(slack.router(api, settings.slack))
    # The alert webhooks skip FastAPI's per-request machinery (plain_routes.py says why).
    serve_plainly(app, webhooks, {alerts.PATH, agent.PATH})
    return app
