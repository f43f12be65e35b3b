"""The Command Center: a read-only web console served beside the API under /ui (`mount`,
called by clients/server.py; the console imports nothing of the API).

Topology (nodes by IB pod, leaf and node set, coloured by state, with the fleet guard and
its breaker; one small cell per node at fleet scale, with search and filters), a node's
Slurm/Kubernetes state, incidents and GPU charts, the fleet's figures over days, every
incident's timeline, and the feed of notifications sent. Pages are Jinja2 (autoescaped) and poll a
JSON twin every few seconds; assets live in the package (no CDN: air-gapped clusters).

Modules: session.py (login, signed cookie), sources.py (Temporal, Slurm, Kubernetes),
cluster_read.py and shared_read.py (one read of the cluster for every viewer, with a
bounded age), topology.py, fleet.py and views.py (what a page shows), prometheus.py (GPU
series), routes.py. Static: console.js, topology.js, console.css and uPlot (vendored).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI

from autoclusters.clients.console.routes import Console, install
from autoclusters.clients.console.session import Sessions
from autoclusters.clients.console.sources import ClientGetter, ConsoleSource, LiveSource
from autoclusters.clients.web.auth import BearerAuth
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core.policy import Policy
from autoclusters.integrations.slurm import SlurmCli

__all__ = ["Console", "ConsoleSource", "LiveSource", "mount"]


def mount(
    app: FastAPI,
    *,
    settings: ApiSettings,
    auth: BearerAuth,
    client: ClientGetter,
    policy: Callable[[], Policy],
    source: ConsoleSource | None = None,
) -> Console:
    """Serve the console from `app`. `source`: where pages read the cluster (default:
    Temporal through `client`, and Slurm's sinfo as the settings say)."""
    source = source or LiveSource(
        settings,
        client,
        SlurmCli(settings.slurm.conf, settings.slurm.bin_dir),
        timeout_s=settings.api_temporal_timeout_s,
    )
    console = Console(
        settings=settings, source=source, sessions=Sessions(settings, auth), policy=policy
    )
    install(app, console)
    return console
