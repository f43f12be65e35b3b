"""`autoclusters share`: GPU nodes shared between Slurm training and Kubernetes inference.

`share start` runs the cluster's sharing workflow (GpuSharing) with a share policy;
`share status` shows nodes per pool, the demand it last saw and the last moves;
`share move --to inference|training --node N` moves one node through the same workflow;
`share approve|reject MOVE` answers a move waiting for a human (as the Approve / Reject
buttons of its Slack message do), through the API with the person's own operator token
(AUTOCLUSTERS_API_TOKEN): the API says who decides and signs the proof the sharing workflow's
worker checks; `share clear NODE` takes a node that failed its health gate on return off the
list of nodes neither pool may take. Exit codes: 0 done; 1 refused (no sharing workflow, a node it
cannot move or clear, a move not waiting for approval); 2 a policy file that does not
validate, or no operator token (or one of another role).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table
from temporalio.client import Client

from autoclusters.clients.cli import connect
from autoclusters.clients.cli.output import console, err
from autoclusters.core.settings import Settings
from autoclusters.core.sharing import (
    ClearUnhealthy,
    MoveRequest,
    Pool,
    SharePolicy,
    SharePolicyError,
    ShareStatus,
    load_share_policy,
    sharing_workflow_id,
)

share_app = typer.Typer(no_args_is_help=True, help="GPU nodes shared by training and inference.")

ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="The cluster (default: the configured one).")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document.")]


def _cluster(s: Settings, cluster: str | None) -> str:
    return cluster or s.cluster


def _ui(s: Settings, cluster: str) -> str:
    return f"{s.temporal.ui_url}/namespaces/default/workflows/{sharing_workflow_id(cluster)}"


@share_app.command("start")
def start(
    policy_file: Annotated[
        Path | None, typer.Option("--policy", "-f", help="A share policy YAML (default: built-in).")
    ] = None,
    cluster: ClusterOpt = None,
) -> None:
    """Start the cluster's sharing workflow (or give the running one this policy)."""
    from autoclusters.clients.sharing import start_sharing

    try:
        policy = load_share_policy(policy_file) if policy_file else SharePolicy()
    except SharePolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None

    async def go(client: Client, s: Settings) -> str:
        c = _cluster(s, cluster)
        await start_sharing(client, c, policy, s.temporal.task_queue)
        return f"sharing workflow of {c} running; Temporal UI: {_ui(s, c)}"

    console.print(connect.run_client(go))


@share_app.command("status")
def status(cluster: ClusterOpt = None, as_json: JsonOpt = False) -> None:
    """Nodes per pool, the demand last seen, the moves."""
    from autoclusters.clients.sharing import SharingNotRunning, share_status

    async def go(client: Client, s: Settings) -> ShareStatus | None:
        try:
            return await share_status(client, _cluster(s, cluster))
        except SharingNotRunning as e:
            err.print(f"[red]{e}[/red]")
            return None

    st = connect.run_client(go)
    if st is None:
        raise typer.Exit(1)
    if as_json:
        typer.echo(st.model_dump_json())
        return
    _print_status(st)


def _when(t: float | None) -> str:
    return "-" if t is None else dt.datetime.fromtimestamp(t, dt.UTC).strftime("%H:%M:%S")


def _print_status(st: ShareStatus) -> None:
    pools: dict[str, list[str]] = {p.value: [] for p in Pool}
    for node, where in sorted(st.pools.items()):
        pools[where.value].append(node)
    table = Table(title=f"GPU sharing on {st.cluster}")
    table.add_column("pool")
    table.add_column("nodes", justify="right")
    table.add_column("which")
    for name, nodes in pools.items():
        table.add_row(name, str(len(nodes)), ", ".join(nodes))
    console.print(table)
    d = st.last_demand
    if d is not None:
        value = "no data" if d.inference_value is None else f"{d.inference_value:.3g}"
        rps = "-" if d.inference_rps is None else f"{d.inference_rps:.1f}"
        console.print(
            f"demand at {_when(d.at)}: inference {value} (SLO {d.slo:g}), {rps} req/s, "
            f"{d.ready_replicas} replicas ready; training: {d.training_pending_gpus} GPUs "
            f"pending, {d.training_running_gpus} running"
        )
    if st.last_verdict is not None:
        console.print(f"last decision: {st.last_verdict.why}")
    if st.current is not None:
        m = st.current
        console.print(
            f"[yellow]moving[/yellow] {m.move.node} to {m.move.to} ({m.status}): "
            + " → ".join(s.name for s in m.steps)
        )
    moves = Table(title="last moves")
    for col in ("move", "node", "to", "status", "started", "took", "why"):
        moves.add_column(col)
    for m in st.moves:
        took = f"{m.finished_at - m.started_at:.0f}s" if m.finished_at else "-"
        moves.add_row(
            m.move.move_id, m.move.node, m.move.to, m.status, _when(m.started_at), took,
            m.error or m.move.reason,
        )  # fmt: skip
    console.print(moves)
    if st.unhealthy:
        console.print(
            f"[red]failed their health gate, left drained:[/red] {st.unhealthy} "
            "(fixed: `autoclusters share clear NODE`)"
        )


@share_app.command("move")
def move(
    to: Annotated[
        Literal["inference", "training"], typer.Option("--to", help="Which side it joins.")
    ],
    node: Annotated[str, typer.Option("--node", help="The node to move.")],
    cluster: ClusterOpt = None,
    by: Annotated[str, typer.Option("--by", help="Who asks (recorded).")] = "cli",
) -> None:
    """Move one node now, through the sharing workflow (the same steps as its own moves)."""
    from autoclusters.clients.sharing import request_move

    req = MoveRequest(node=node, to=to, requested_by=by)
    move_id = _refusable(lambda c, s: request_move(c, _cluster(s, cluster), req))
    console.print(
        f"move {move_id}: {node} to {to} queued; follow it with `autoclusters share status`"
    )


def _refusable(call: Callable[[Client, Settings], Awaitable[str]]) -> str:
    """Run one of the sharing workflow's updates; a refusal is printed with its reason, exit 1."""
    from autoclusters.clients.sharing import MoveRefused

    async def go(client: Client, s: Settings) -> str | None:
        try:
            return await call(client, s)
        except MoveRefused as e:
            err.print(f"[red]refused:[/red] {escape(str(e))}")
            return None

    answer = connect.run_client(go)
    if answer is None:
        raise typer.Exit(1)
    return answer


def _decide(move_id: str, approve: bool, claimed: str | None, cluster: str | None) -> None:
    from autoclusters.clients.cli.decisions import DecisionError, post_move_decision

    if claimed is not None:
        err.print(
            "--by is gone: the API takes who you are from your own operator token "
            "(AUTOCLUSTERS_API_TOKEN)"
        )
        raise typer.Exit(2)
    try:
        d = post_move_decision(connect.load_settings(), move_id, approve, cluster)
    except DecisionError as e:
        err.print(f"[red]refused:[/red] {escape(str(e))}" if e.code == 3 else escape(str(e)))
        raise typer.Exit(1 if e.code == 3 else e.code) from None
    console.print(f"move {d.move_id} {d.outcome} by {escape(d.by)}")


# `--by` named who decided; the API says who now (hidden: a clear error, not "no such option").
ClaimedOpt = Annotated[str | None, typer.Option("--by", hidden=True)]


@share_app.command("approve")
def approve(
    move_id: Annotated[str, typer.Argument(help="The move waiting for approval.")],
    cluster: ClusterOpt = None,
    claimed: ClaimedOpt = None,
) -> None:
    """Approve a move that waits for a human, as the person whose operator token
    AUTOCLUSTERS_API_TOKEN is (through the API)."""
    _decide(move_id, True, claimed, cluster)


@share_app.command("reject")
def reject(
    move_id: Annotated[str, typer.Argument(help="The move waiting for approval.")],
    cluster: ClusterOpt = None,
    claimed: ClaimedOpt = None,
) -> None:
    """Reject a move that waits for a human (the node stays where it is), as the person
    whose operator token AUTOCLUSTERS_API_TOKEN is (through the API)."""
    _decide(move_id, False, claimed, cluster)


@share_app.command("clear")
def clear(
    node: Annotated[str, typer.Argument(help="A node listed as failed its health gate.")],
    by: Annotated[str, typer.Option("--by", help="Who fixed it (recorded).")] = "cli",
    cluster: ClusterOpt = None,
) -> None:
    """A node that failed its health gate on the way back from inference is fixed: the
    sharing workflow may move it again. Resume it in Slurm yourself when it should take jobs."""
    from autoclusters.clients.sharing import clear_unhealthy

    req = ClearUnhealthy(node=node, by=by)
    console.print(_refusable(lambda c, s: clear_unhealthy(c, _cluster(s, cluster), req)))
