"""`autoclusters stats`: what the cluster's incident history says.

`stats ladder`: per fault kind and rung, how often the repair was tried, how often it held
(the node passed its health gate and had no new incident within the recurrence window) and
the median time from the incident's start to the node back in service. A policy's
`skip_rung_below` is judged on these figures.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from autoclusters.clients.cli.output import console, err
from autoclusters.clients.cli.policy import ClusterOption, HistoryOption, SinceOption, read_records

stats_app = typer.Typer(no_args_is_help=True, help="Figures from the cluster's incident history.")


@stats_app.callback()
def _group() -> None:
    pass


@stats_app.command("ladder")
def ladder(
    since: SinceOption = "30d",
    cluster: ClusterOption = None,
    from_history: HistoryOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Attempts, success rate and median time to capacity per (fault kind, rung)."""
    from autoclusters.core.ladder import figures_from

    read = read_records(since, cluster, from_history)
    figures = figures_from(read.records)
    if as_json:
        body = figures.model_dump(mode="json")
        for row, fig in zip(body["rows"], figures.rows, strict=True):
            row["success_rate"] = fig.success_rate
        body.update(cluster=read.cluster, unreadable=read.unreadable)
        print(json.dumps(body))
        return
    table = Table("fault", "rung", "attempts", "success", "median to capacity")
    for r in figures.rows:
        rate = f"{r.success_rate:.0%} ({r.successes})" if r.success_rate is not None else "-"
        cap = f"{r.median_capacity_s:.1f} s" if r.median_capacity_s is not None else "-"
        table.add_row(escape(r.fault), r.rung, str(r.attempts), rate, cap)
    console.print(table)
    console.print(f"{figures.incidents} incidents read (cluster {escape(read.cluster)})")
    for bad in read.unreadable:
        err.print(f"[yellow]not read:[/yellow] {escape(bad)}")
