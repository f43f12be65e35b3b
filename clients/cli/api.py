"""`autoclusters api run|token`: serve the HTTP API (Alertmanager webhook, agent reports,
incident reads) with the web console (clients/server.py), and make a bearer token for it."""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import sys
from typing import Annotated

import typer
from pydantic import ValidationError

from autoclusters.clients.cli.output import err
from autoclusters.clients.web.tokens import Role

api_app = typer.Typer(no_args_is_help=True, help="The HTTP API for alerts and incidents.")


@api_app.command("run")
def run(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (default: api_host, 127.0.0.1).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port (default: api_port, 8480).")] = None,
) -> None:
    """Serve the API until interrupted.

    Settings come from AUTOCLUSTERS_* and autoclusters.toml; bearer tokens, each with its
    role, from api_tokens, e.g. AUTOCLUSTERS_API_TOKENS='{"alertmanager": "<token>",
    "alice": {"role": "operator", "sha256": "<hex>"}}' (docs/security.md).
    """
    from autoclusters.clients.server import create_server
    from autoclusters.clients.web.quiet_server import serve
    from autoclusters.clients.web.settings import ApiSettings
    from autoclusters.core.policy import PolicyError

    try:
        s = ApiSettings()
        app = create_server(s)
    except (ValidationError, PolicyError) as e:
        err.print(f"[red]bad settings:[/red] {e}")
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=s.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stdout,
    )
    if not s.api_tokens:
        err.print("[yellow]no api_tokens configured: every write will be refused (401)[/yellow]")
    serve(
        app,
        host=host or s.api_host,
        port=s.api_port if port is None else port,
        log_level=s.log_level.lower(),
        access_log=False,
        # Alertmanager and agents keep connections open; in-flight requests finish on
        # shutdown (each waits at most api_temporal_timeout_s for Temporal).
        timeout_graceful_shutdown=int(s.api_temporal_timeout_s) + 5,
    )


@api_app.command("token")
def token(
    role: Annotated[
        Role | None,
        typer.Option(help="Also print its api_tokens entry, for this role."),
    ] = None,
    name: Annotated[
        str | None,
        typer.Option(
            help="The entry's name (an operator's: the person, as the policy names them)."
        ),
    ] = None,
) -> None:
    """Print a new random bearer token; with --role, also the api_tokens entry that grants
    it (an operator's as its SHA-256 only: give the token to the person, the entry to the
    API)."""
    value = secrets.token_urlsafe(32)
    print(value)
    if role is None:
        return
    entry: dict[str, str] = {"role": role}
    if role == "operator":
        entry["sha256"] = hashlib.sha256(value.encode()).hexdigest()
    else:
        entry["token"] = value
    print(json.dumps({name or role: entry}))
