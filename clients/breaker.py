"""The fleet guard's circuit breaker, for operators: `autoclusters breaker status|reset`.

The guard (one workflow per cluster) starts with the cluster's first incident. These
calls only read or reset it; they never start one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from temporalio.client import (
    Client,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from autoclusters.core.guard import BreakerStatus, GuardStatus, ResetRequest, guard_workflow_id
from autoclusters.core.settings import Settings
from autoclusters.workflows.fleet_guard import FleetGuard

T = TypeVar("T")
# A guard that does not answer within this long has no worker polling its task queue.
ANSWER_TIMEOUT = timedelta(seconds=15)


class GuardError(RuntimeError):
    """The guard could not be asked: not started, not running, or not answering."""


class GuardNotStarted(GuardError, LookupError):
    pass


class BreakerNotTripped(GuardError):
    pass


class NotAnApprover(GuardError):
    """The reset was refused: only the policy's approvers may reset the breaker."""


def _handle(client: Client, cluster: str) -> WorkflowHandle[FleetGuard, None]:
    return client.get_workflow_handle_for(FleetGuard.run, guard_workflow_id(cluster))


def _not_started(cluster: str) -> GuardNotStarted:
    return GuardNotStarted(
        f"the fleet guard of cluster {cluster} ({guard_workflow_id(cluster)}) is not running; "
        "it starts with the cluster's first incident"
    )


def _no_answer(cluster: str) -> GuardError:
    return GuardError(
        f"the fleet guard of cluster {cluster} did not answer within "
        f"{ANSWER_TIMEOUT.total_seconds():.0f} s: is a worker running?"
    )


async def breaker_status(client: Client, cluster: str) -> GuardStatus:
    """The guard's state: breaker, limits, nodes out of service and repairing."""
    try:
        return await _handle(client, cluster).query(FleetGuard.status, rpc_timeout=ANSWER_TIMEOUT)
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _not_started(cluster) from None
        if e.status == RPCStatusCode.DEADLINE_EXCEEDED:
            raise _no_answer(cluster) from None
        raise


async def reset_breaker(client: Client, cluster: str, by: str) -> BreakerStatus:
    """A human resets the tripped breaker; repairs are admitted again."""
    try:
        return await _handle(client, cluster).execute_update(
            FleetGuard.reset_breaker, ResetRequest(by=by), rpc_timeout=ANSWER_TIMEOUT
        )
    except WorkflowUpdateFailedError as e:
        cause = e.cause
        if isinstance(cause, ApplicationError) and cause.type == "BreakerNotTripped":
            raise BreakerNotTripped(cause.message) from None
        if isinstance(cause, ApplicationError) and cause.type == "NotAnApprover":
            raise NotAnApprover(f"reset refused: {cause.message}") from None
        raise GuardError(f"reset refused: {getattr(cause, 'message', None) or cause}") from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise _no_answer(cluster) from None
    except RPCError as e:
        # Not found: never started, or its run is closed (it normally never ends).
        if e.status == RPCStatusCode.NOT_FOUND:
            raise _not_started(cluster) from None
        raise


# --- command line ------------------------------------------------------------------------

breaker_app = typer.Typer(
    no_args_is_help=True, help="The fleet guard's circuit breaker: see it, reset it."
)
console = Console()
err = Console(stderr=True)

ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="The cluster (default: from the settings).")
]


def _run(fn: Callable[[Client, Settings], Awaitable[T]]) -> T:
    """Run `fn(client, settings)` against the configured Temporal, saying what went wrong."""
    from autoclusters.core import settings as settings_mod
    from autoclusters.integrations import temporal

    try:
        s = settings_mod.load()
    except ValidationError as e:
        err.print(f"[red]bad settings:[/red] {e}")
        raise typer.Exit(2) from None

    async def go() -> T:
        return await fn(await temporal.connect(s), s)

    try:
        return asyncio.run(go())
    except GuardError as e:
        err.print(" ".join(str(e).split()), style="red", markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except RuntimeError as e:
        if "connect" in str(e).lower():
            err.print(
                f"[red]cannot reach Temporal at {s.temporal_address}[/red]: is the sandbox up? "
                "(`autoclusters sandbox up`)"
            )
            raise typer.Exit(1) from None
        raise


@breaker_app.command("status")
def status_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    cluster: ClusterOpt = None,
) -> None:
    """Show the breaker, the guard's limits, and the nodes out of service and repairing."""

    async def go(client: Client, s: Settings) -> GuardStatus:
        return await breaker_status(client, cluster or s.cluster)

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
            "repairs are held (`autoclusters breaker reset --as YOU`)"
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
        f"at least {p.min_in_service_fraction:.0%} of nodes in service"
    )
    console.print(f"approvers (may reset): {', '.join(st.approvers) or 'none'}")
    for w in state.queue:
        console.print(f"waiting for {w.kind}: {w.node} ({w.incident_id}) since {w.since:%H:%M:%S}")
    t = Table("node", "out of service", "repairing")
    for node in sorted({*state.out_of_service, *state.repairing}):
        t.add_row(node, state.out_of_service.get(node, ""), state.repairing.get(node, ""))
    if t.row_count:
        console.print(t)


@breaker_app.command("reset")
def reset_cmd(
    by: Annotated[str, typer.Option("--as", help="Who resets it: an approver (recorded).")],
    cluster: ClusterOpt = None,
) -> None:
    """Reset the tripped breaker (approvers only; recorded): repairs are admitted again."""

    async def go(client: Client, s: Settings) -> tuple[str, BreakerStatus | None]:
        name = cluster or s.cluster
        try:
            return name, await reset_breaker(client, name, by)
        except BreakerNotTripped:
            return name, None

    name, b = _run(go)
    if b is None:
        err.print(f"the breaker of {name} is not tripped; nothing to reset")
        return
    console.print(f"breaker of {name} reset by {b.reset_by} at {b.reset_at:%Y-%m-%d %H:%M:%S} UTC")
