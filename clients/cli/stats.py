"""`autoclusters stats`: what the cluster's incident history says.

`stats ladder`: per fault kind and rung, how often the repair was tried, how often it held
(the node passed its health gate and had no new incident within the recurrence window) and
the median time from the incident's start to the node back in service. A policy's
`skip_rung_below` is judged on these figures.

`stats recovery`: what the closed incidents measured of their jobs' recovery (policy
`measure_recovery`): per path, the median seconds from the fault to the job stepping again
(the policy's `recovery_figures` for this cluster), the figures the next plan weighs (the
median of the last measured per path under `figures_from_history`: core/recovery_history.py),
and how good the planner's estimates have been (median and worst |actual - estimate| /
actual, how many within ±30 %).
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


@stats_app.command("recovery")
def recovery(
    since: SinceOption = "30d",
    cluster: ClusterOption = None,
    from_history: HistoryOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Measured seconds to stepping again per recovery path, and the estimates' error."""
    from autoclusters.core.recovery_history import (
        FiguresFromHistory,
        figures_from_history,
        measured_from,
    )
    from autoclusters.core.recovery_loss import estimate_quality, figures_by_path

    read = read_records(since, cluster, from_history)
    losses = [x for r in read.records for x in r.recovery_losses]
    paths = figures_by_path(losses)
    quality = estimate_quality(losses)
    # What the next plan weighs under the latest incident's policy (its figures the prior).
    weighs = None
    if read.records:
        latest = read.records[-1].policy
        measured = [
            m
            for r in read.records
            for m in measured_from(r.recovery_losses, r.closed_at or r.started_at)
        ]
        weighs = figures_from_history(
            measured,
            latest.recovery_figures,
            latest.figures_from_history or FiguresFromHistory(),
            incidents=len(read.records),
        )
    if as_json:
        body = {
            "paths": [p.model_dump(mode="json") for p in paths],
            "next_plan": weighs.model_dump(mode="json") if weighs is not None else None,
            "estimates": quality.model_dump(mode="json"),
            "incidents": len(read.records),
            "cluster": read.cluster,
            "unreadable": read.unreadable,
        }
        print(json.dumps(body))
        return
    table = Table("path", "measured", "median to stepping again", "median redone")
    for p in paths:
        table.add_row(p.path, str(p.measured), f"{p.median_resume_s:.1f} s",
                      f"{p.median_redo_s:.0f} s")  # fmt: skip
    console.print(table)
    if weighs is not None:
        console.print(f"the next plan weighs: {escape(weighs.describe())}")
    if quality.measured:
        console.print(
            f"estimates: {quality.within} of {quality.measured} within ±30 %, median off by "
            f"{quality.median_error:.0%}, worst {quality.worst_error:.0%}; "
            f"{quality.unknown} not measured"
        )
    else:
        console.print(f"no measured loss ({quality.unknown} not measured)")
    console.print(f"{len(read.records)} incidents read (cluster {escape(read.cluster)})")
    for bad in read.unreadable:
        err.print(f"[yellow]not read:[/yellow] {escape(bad)}")
