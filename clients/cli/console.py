"""`autoclusters console`: where the Command Center (the API's /ui) is for the configured
cluster — the running sandbox's unless AUTOCLUSTERS_CONFIG names another.

stdout is the URL alone (scripts open it); how to log in goes to stderr.
"""

from __future__ import annotations

from typing import Annotated

import httpx
import typer
from pydantic import ValidationError

from autoclusters.clients.cli.output import err
from autoclusters.core.net import is_loopback

# Addresses a server binds to that a browser cannot open as such.
_ANY = {"", "0.0.0.0", "::", "[::]"}


def console_url(api_public_url: str | None, api_host: str, api_port: int) -> str:
    if api_public_url:
        return api_public_url.rstrip("/") + "/ui/"
    host = "127.0.0.1" if api_host in _ANY else api_host
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{api_port}/ui/"


def console(
    check: Annotated[
        bool, typer.Option("--check", help="Also ask the API whether it answers (exit 1 if not).")
    ] = False,
) -> None:
    """Print the console's URL (the API's /ui) for the running sandbox or configured API."""
    from autoclusters.clients.web.settings import ApiSettings
    from autoclusters.core.settings import config_file

    try:
        s = ApiSettings()
    except ValidationError as e:
        err.print(f"[red]bad settings:[/red] {e}")
        raise typer.Exit(2) from None
    url = console_url(s.api_public_url, s.api_host, s.api_port)
    if config_file() is None:
        err.print("no running sandbox and no AUTOCLUSTERS_CONFIG: the API's default address")
    if s.console.loopback_open and is_loopback(s.api_host):
        err.print("open without a login from this machine ([console] loopback_open)")
    elif any(g.role in ("reader", "operator") for g in s.api_tokens.values()):
        names = ", ".join(
            sorted(n for n, g in s.api_tokens.items() if g.role in ("reader", "operator"))
        )
        err.print(f"log in with a reader's or operator's token (api_tokens: {names})")
    else:
        err.print("[yellow]no api_tokens configured: nobody can log in[/yellow]")
    typer.echo(url)
    if check:
        try:
            httpx.get(url.removesuffix("/ui/") + "/healthz", timeout=3, trust_env=False)
        except httpx.HTTPError as e:
            err.print(f"[red]the API does not answer at {url}[/red]: {e}")
            raise typer.Exit(1) from None
