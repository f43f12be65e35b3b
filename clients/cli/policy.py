"""`autoclusters policy`: check a remediation policy file, replay it over the incidents the
cluster has had, and put it live.

Exit codes: 0 done; 1 Temporal not reachable; 2 a policy file (or option) that cannot be
used; 3 `apply` refused: the replay changes outcomes (give --accept-changes) or could not
read every incident.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from autoclusters.clients.cli.output import console, err
from autoclusters.core.policy import LADDER, Policy, PolicyError, load_policy

if TYPE_CHECKING:
    from autoclusters.clients.incident_history import IncidentHistories
    from autoclusters.core.policy_replay import ReplayReport

policy_app = typer.Typer(no_args_is_help=True, help="Check, replay and apply remediation policies.")

SinceOption = Annotated[
    str, typer.Option(help="How far back to read incidents: 30d, 12h, 90m, or all.")
]
ClusterOption = Annotated[
    str | None, typer.Option(help="The cluster whose incidents to read (default: settings).")
]
HistoryOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--from-history",
        help="Read incidents from this exported history (temporal workflow show --output "
        "json) instead of Temporal; repeatable.",
    ),
]
NodesOption = Annotated[
    int | None,
    typer.Option(min=1, help="The cluster's size, for recounted guard limits (default: "
                 "the nodes the incidents name)."),
]  # fmt: skip


@policy_app.callback()
def _group() -> None:
    # Keeps `check` a named sub-command even while it is the only one.
    pass


def _load(file: Path) -> Policy:
    try:
        return load_policy(file)
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


@policy_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="The policy YAML file, e.g. policy.yaml.")],
) -> None:
    """Validate FILE and print a summary; on errors print each with its line, exit 2."""
    policy = _load(file)
    # Plain echo, not rich: field paths such as approvers[0] would read as markup.
    gated = [r.value for r in LADDER if r in policy.steps and policy.step(r).needs_approval]
    d = policy.default_rule
    typer.echo(f"{file}: OK")
    typer.echo(f"mode: {policy.mode}")
    typer.echo(f"fault rules: {len(policy.faults)}")
    typer.echo(f"default rule: {d.severity} / {d.first_rung.value}")
    nobody = "(nobody: every approval is refused)"
    typer.echo(f"approvers: {', '.join(policy.approvers) if policy.approvers else nobody}")
    typer.echo(f"steps needing approval: {', '.join(gated) if gated else '(none)'}")
    if policy.skip_rung_below > 0:
        typer.echo(
            f"skip a rung below {policy.skip_rung_below:.0%} success "
            f"(from {policy.min_samples} tries)"
        )


def read_records(
    since: str, cluster: str | None, histories: list[Path] | None
) -> IncidentHistories:
    """The incidents a replay or the ladder reads: from files, or from the cluster's
    Temporal (read-only). Shared by `policy` and `stats`."""
    from autoclusters.clients import incident_history as ih
    from autoclusters.clients.cli import connect

    try:
        window = ih.parse_since(since)
    except ValueError as e:
        err.print(f"[red]{escape(str(e))}[/red]")
        raise typer.Exit(2) from None
    if histories:
        return ih.read_history_files(histories, cluster)

    async def go(client: Any, s: Any) -> ih.IncidentHistories:
        return await ih.read_incidents(client, cluster or s.cluster, window)

    return connect.run_client(go)


def _print_report(report: ReplayReport, read: IncidentHistories) -> None:
    sm = report.summary
    for d in report.incidents:
        if not d.changed:
            continue
        console.print(
            f"[bold]{escape(d.incident_id)}[/bold] {escape(d.node)} {escape(d.fault)} "
            f"({d.started_at:%Y-%m-%d %H:%M})"
        )
        for line in d.changes:
            console.print(f"  {escape(line)}")
        for note in d.notes:
            console.print(f"  [dim]assumed: {escape(note)}[/dim]")
    avoided = ", ".join(f"{n} {r}" for r, n in sorted(sm.avoided.items())) or "none"
    added = ", ".join(f"{n} {r}" for r, n in sorted(sm.added.items())) or "none"
    console.print(
        f"{sm.changed} of {sm.incidents} incidents change "
        f"(cluster {escape(read.cluster)}"
        + (f", since {read.since:%Y-%m-%d %H:%M}" if read.since else "")
        + ")"
    )
    console.print(f"repairs: {sm.repairs_live} -> {sm.repairs_candidate}")
    console.print(f"repairs avoided: {avoided}; added: {added}")
    console.print(f"approvals asked: {sm.approvals_live} -> {sm.approvals_candidate}")
    console.print(f"held by the fleet guard: {sm.held_live} -> {sm.held_candidate}")
    console.print(f"breaker tripped: {sm.breaker_live} -> {sm.breaker_candidate}")
    if sm.unknown_outcomes:
        console.print(f"outcome unknown (a rung never tried): {sm.unknown_outcomes}")
    for bad in read.unreadable:
        # Whole lines: a path wrapped at the terminal's width cannot be copied back.
        err.print(f"[yellow]not read:[/yellow] {escape(bad)}", soft_wrap=True)


def _replay(
    file: Path, since: str, cluster: str | None, histories: list[Path] | None, nodes: int | None
) -> tuple[Policy, ReplayReport, IncidentHistories]:
    from autoclusters.core.policy_replay import replay_policy

    candidate = _load(file)
    read = read_records(since, cluster, histories)
    return candidate, replay_policy(candidate, read.records, cluster_nodes=nodes), read


def _as_json(report: ReplayReport, read: IncidentHistories, **extra: Any) -> str:
    import json

    body = report.model_dump(mode="json")
    for d, diff in zip(body["incidents"], report.incidents, strict=True):
        d["changed"] = diff.changed
    body.update(cluster=read.cluster, unreadable=read.unreadable, **extra)
    return json.dumps(body)


@policy_app.command("replay")
def replay(
    file: Annotated[Path, typer.Argument(help="The candidate policy YAML file.")],
    since: SinceOption = "30d",
    cluster: ClusterOption = None,
    from_history: HistoryOption = None,
    nodes: NodesOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """What FILE would have done in each incident of the cluster, beside what the live
    policy did: rung, approval, fleet guard, breaker, repairs. Reads only."""
    _, report, read = _replay(file, since, cluster, from_history, nodes)
    if as_json:
        print(_as_json(report, read))
    else:
        _print_report(report, read)


@policy_app.command("apply")
def apply(
    file: Annotated[Path, typer.Argument(help="The policy YAML file to put live.")],
    accept_changes: Annotated[
        bool,
        typer.Option(help="Apply even though the replay changes what incidents would do."),
    ] = False,
    since: SinceOption = "30d",
    cluster: ClusterOption = None,
    from_history: HistoryOption = None,
    nodes: NodesOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Replay FILE, then write it over the cluster's policy_file (the API reads it again on
    its next incident; a running incident keeps its snapshot). Refused (exit 3) when the
    replay changes an outcome or could not read every incident, unless --accept-changes."""
    from autoclusters.clients.cli import connect

    _, report, read = _replay(file, since, cluster, from_history, nodes)
    target = connect.load_settings().policy_file
    refused = (report.changes_outcomes or bool(read.unreadable)) and not accept_changes
    if as_json:
        print(_as_json(report, read, applied=not refused and target is not None))
    else:
        _print_report(report, read)
    if refused:
        why = (
            f"the replay changes {report.summary.changed} of {report.summary.incidents} incidents"
            if report.changes_outcomes
            else f"{len(read.unreadable)} incident histories could not be read"
        )
        err.print(
            f"[red]not applied:[/red] {why}; give --accept-changes to apply it anyway",
            soft_wrap=True,
        )
        raise typer.Exit(3)
    if target is None:
        err.print(
            "[red]not applied:[/red] no policy_file is set (the cluster runs the shipped "
            "policy): set policy_file in the settings, then apply"
        )
        raise typer.Exit(2)
    _write(target, file.read_text())
    if not as_json:
        console.print(f"applied: {escape(str(file))} -> {escape(str(target))}")


def _write(target: Path, text: str) -> None:
    """Replace `target` whole (a reader never sees half a policy): write beside, then rename."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
