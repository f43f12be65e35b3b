"""`autoclusters breaker status|reset`: the fleet guard's circuit breaker, for operators.

`status` asks the guard through Temporal; `reset` goes through the API with the person's own
operator token (AUTOCLUSTERS_API_TOKEN): the API says who resets and signs the proof the
guard's worker checks (clients/cli/decisions.py), so naming someone is not possible.

Exit codes: 0 shown or reset (or nothing to reset); 1 the guard is not running, not answering
or refused the reset; 2 bad settings (no operator token, or one of another role).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

import typer
from rich.table import Table
from temporalio.client import Client

# The module, not its names: tests replace breaker_status and reset_breaker in it.
from autoclusters.clients import breaker
from autoclusters.clients.cli import connect
from autoclusters.clients.cli.output import console, err
from autoclusters.core.guard import GuardStatus, floor_of
from autoclusters.core.settings import Settings

T = TypeVar("T")

breaker_app = typer.Typer(
    no_args_is_help=True, help="The fleet guard's circuit breaker: see it, reset it."
)

ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="The cluster (default: from the settings).")
]


def _run(fn: Callable[[Client, Settings], Awaitable[T]]) -> T:
    return connect.run_client(fn, refusals=(breaker.GuardError,), say=_say_guard_error)


def _say_guard_error(e: Exception) -> None:
    # One line whatever the guard's message holds; plain text, not markup.
    err.print(" ".join(str(e).split()), style="red", markup=False, soft_wrap=True)


@breaker_app.command("status")
def status_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    cluster: ClusterOpt = None,
) -> None:
    """Show the breaker, the guard's limits, and the nodes out of service and repairing."""

    async def go(client: Client, s: Settings) -> GuardStatus:
        return await breaker.breaker_status(client, cluster or s.cluster)

    st = _run(go)
    if as_json:
        print(st.model_dump_json())
        return
    _print_status(st)


def _print_status(st: GuardStatus) -> None:
    b, p, state = st.state.breaker, st.policy, st.state
    if b.tripped:
        console.print(
            f"[bold red]breaker TRIPPED[/bold red] at {b.tripped_at:%Y-%m-%d %H:%M:%S} UTC: "
            "repairs are held (an approver: `autoclusters breaker reset`)"
        )
    else:
        console.print(f"breaker [green]closed[/green] (cluster {st.cluster})")
    if b.nodes:
        where = [
            f"leaf {b.shared_leaf}" if b.shared_leaf else "",
            f"pod {b.shared_pod}" if b.shared_pod else "",
        ]
        shared = " and ".join(w for w in where if w)
        label = "tripped by" if b.tripped else "last tripped by"
        console.print(
            f"{label}: {', '.join(b.nodes)}" + (f" (all behind {shared})" if shared else "")
        )
    if b.reset_at is not None:
        console.print(f"last reset by {b.reset_by} at {b.reset_at:%Y-%m-%d %H:%M:%S} UTC")
    console.print(
        f"limits: trips on more than {p.breaker_limit(state.cluster_nodes)} incidents within "
        f"{p.breaker_window_s:.0f} s (at least {p.breaker_threshold}, "
        f"{p.breaker_threshold_fraction:.0%} of {state.cluster_nodes} nodes); at most "
        f"{p.max_concurrent_repairs} repairs at once; "
        f"at least {p.min_in_service_fraction:.0%} of nodes in service "
        f"(below it: {', '.join(p.below_floor) or 'nothing'})"
    )
    if state.cluster_nodes:
        in_service = state.cluster_nodes - len(state.counted_out())
        console.print(
            f"in service: {in_service} of {state.cluster_nodes} nodes "
            f"(floor {floor_of(p, state.cluster_nodes)})"
        )
    console.print(f"approvers (may reset): {', '.join(st.approvers) or 'none'}")
    for w in state.queue:
        what = "drain while held (at the floor)" if w.kind == "held_drain" else w.kind
        console.print(f"waiting for {what}: {w.node} ({w.incident_id}) since {w.since:%H:%M:%S}")
    t = Table("node", "out of service", "repairing")
    for node in sorted({*state.counted_out(), *state.repairing}):
        out = state.out_of_service.get(node, "")
        if node in state.held_drained:
            out = f"{state.held_drained[node]} (drained while held)"
        t.add_row(node, out, state.repairing.get(node, ""))
    if t.row_count:
        console.print(t)


@breaker_app.command("reset")
def reset_cmd(
    cluster: ClusterOpt = None,
    claimed: Annotated[str | None, typer.Option("--as", hidden=True)] = None,
) -> None:
    """Reset the tripped breaker as the person whose operator token AUTOCLUSTERS_API_TOKEN
    is (through the API; approvers only; recorded): repairs are admitted again."""
    from autoclusters.clients.cli.decisions import DecisionError, NotTripped, post_breaker_reset

    if claimed is not None:
        err.print(
            "--as is gone: the API takes who you are from your own operator token "
            "(AUTOCLUSTERS_API_TOKEN)"
        )
        raise typer.Exit(2)
    s = connect.load_settings()
    name = cluster or s.cluster
    try:
        b = post_breaker_reset(s, cluster)
    except NotTripped:
        err.print(f"the breaker of {name} is not tripped; nothing to reset")
        return
    except DecisionError as e:
        _say_guard_error(e)
        raise typer.Exit(1 if e.code == 3 else e.code) from None
    at = f" at {b.reset_at:%Y-%m-%d %H:%M:%S} UTC" if b.reset_at else ""
    console.print(f"breaker of {name} reset by {b.reset_by}{at}")
