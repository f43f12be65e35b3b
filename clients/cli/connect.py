"""Reaching Temporal from a command: read the settings, connect, run one coroutine, and turn
what an operator can act on into one line on stderr and an exit code instead of a traceback.

Exit codes: 2 bad settings; 1 Temporal not reachable, or one of the command's own refusals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer
from pydantic import ValidationError
from rich.text import Text
from temporalio.client import Client

from autoclusters.clients.cli.output import err
from autoclusters.core import settings as settings_mod
from autoclusters.core.settings import Settings

T = TypeVar("T")


def load_settings() -> Settings:
    """The settings (environment over file over defaults); bad ones are exit 2."""
    try:
        return settings_mod.load()
    except ValidationError as e:
        err.print(f"[red]bad settings:[/red] {e}")
        raise typer.Exit(2) from None


def say_refused(e: Exception) -> None:
    # A Text, not markup: names such as node_sets[0] in the message stay as they are.
    err.print(Text(str(e), style="red"), soft_wrap=True)


def run_client(
    fn: Callable[[Client, Settings], Awaitable[T]],
    *,
    refusals: tuple[type[Exception], ...] = (),
    say: Callable[[Exception], None] = say_refused,
) -> T:
    """Run `fn(client, settings)` against the configured Temporal. An exception in `refusals`
    (the command's "no, because ...") is `say`-ed and exit 1; so is no Temporal at all."""
    from autoclusters.integrations import temporal

    s = load_settings()

    async def go() -> T:
        return await fn(await temporal.connect(s), s)

    try:
        return asyncio.run(go())
    except refusals as e:  # before the RuntimeError below: some refusals are RuntimeErrors
        say(e)
        raise typer.Exit(1) from None
    except RuntimeError as e:
        if "connect" not in str(e).lower():
            raise
        err.print(
            f"[red]cannot reach Temporal at {s.temporal.address}[/red]: is the sandbox up? "
            "(`autoclusters sandbox up`)"
        )
        raise typer.Exit(1) from None
