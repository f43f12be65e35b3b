"""`autoclusters`: the operator's command line."""

# The docstring above is the root command's help; this module only assembles the command
# groups, one module each in this package, and the commands other installed parts add.

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import entry_points

import typer

from autoclusters.clients.cli.agent import agent_app, inject_app
from autoclusters.clients.cli.api import api_app
from autoclusters.clients.cli.breaker import breaker_app
from autoclusters.clients.cli.cluster import cluster_app
from autoclusters.clients.cli.console import console as console_command
from autoclusters.clients.cli.faults import faults
from autoclusters.clients.cli.incidents import approve, incident_app
from autoclusters.clients.cli.policy import policy_app
from autoclusters.clients.cli.share import share_app
from autoclusters.clients.cli.stats import stats_app
from autoclusters.clients.cli.worker import worker

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
# `autoclusters --help` lists them in this order (the commands, then the groups).
app.add_typer(incident_app, name="incident")
app.add_typer(breaker_app, name="breaker")
app.add_typer(policy_app, name="policy")
app.add_typer(stats_app, name="stats")
app.add_typer(cluster_app, name="cluster")
app.add_typer(share_app, name="share")
app.add_typer(agent_app, name="agent")
app.add_typer(inject_app, name="inject")
app.add_typer(api_app, name="api")
app.command("console")(console_command)
app.command("worker")(worker)
app.command("approve")(approve)
app.command("faults")(faults)


def _plugins() -> None:
    """Commands other installed parts add (the sandbox: `sandbox ...`, `demo`, `chaos`),
    found through the `autoclusters.cli` entry points: this package imports none of them,
    and an install without them (the worker image) simply lacks those commands."""
    for ep in entry_points(group="autoclusters.cli"):
        try:
            register = ep.load()
        except ImportError as e:  # the part is not installed here (its extra is missing)
            logging.getLogger("autoclusters.cli").debug("no %s commands: %s", ep.name, e)
            continue
        register(app)


def main() -> None:
    # Temporal's Rust threads can crash a finishing interpreter (sdk-python#300): flush and
    # leave with os._exit so the exit code is the command's own.
    rc = 0
    try:
        _plugins()
        app()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
