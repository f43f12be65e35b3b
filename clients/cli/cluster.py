"""`autoclusters cluster`: validate a spec; create, follow, scale, delete and list clusters.

Each command that reaches a workflow prints its Temporal UI link. Exit codes: 0 done (or
started); 1 refused or failed (unknown cluster, busy, still provisioning, the provisioning
failed: nothing is started by a refusal); 2 a spec that does not validate.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table
from rich.text import Text
from temporalio.client import Client

from autoclusters.clients.cli import connect
from autoclusters.clients.cli.output import console, err
from autoclusters.core.cluster import ClusterState
from autoclusters.core.cluster_ops import OpsState
from autoclusters.core.cluster_spec import ClusterSpecError, load_cluster_spec
from autoclusters.core.settings import Settings

cluster_app = typer.Typer(no_args_is_help=True, help="Slurm clusters described by a spec.")
T = TypeVar("T")

ClusterArg = Annotated[str, typer.Argument(help="The cluster's name (from its spec).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document.")]


@cluster_app.callback()
def _group() -> None:
    # Keeps `validate` a named sub-command even while it is the only one.
    pass


def _load(file: Path) -> Any:
    try:
        return load_cluster_spec(file)
    except ClusterSpecError as e:
        # Plain echo, not rich: field paths such as node_sets[0] would read as markup.
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


@cluster_app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="The cluster spec, e.g. examples/clusters/x.yaml.")],
) -> None:
    """Check FILE (and the policy it attaches): each problem as file:line: field: message,
    exit 2; or a one-line summary, exit 0."""
    spec, policy = _load(file)
    sets = ", ".join(f"{s.name}×{s.count} ({s.instance_type})" for s in spec.node_sets)
    typer.echo(
        f"{file}: OK: cluster {spec.name} on {spec.provider} in {spec.location}: "
        f"{len(spec.nodes())} nodes [{sets}], {spec.login.count} login, "
        f"accounting {'on' if spec.accounting else 'off'}, {len(spec.users)} users, "
        f"policy mode {policy.mode}"
    )


# --- reaching Temporal ---------------------------------------------------------------------


def _run(fn: Callable[[Client, Settings], Awaitable[T]]) -> T:
    """Run `fn(client, settings)` against the configured Temporal; a refusal or an unknown
    cluster is one red line and exit 1."""
    from autoclusters.clients.clusters import ClusterNotFound, ClusterRefused

    return connect.run_client(fn, refusals=(ClusterNotFound, ClusterRefused))


def _say(line: str, *, to_err: bool = False) -> None:
    (err if to_err else console).print(line, markup=False, highlight=False, soft_wrap=True)


# --- create --------------------------------------------------------------------------------


@cluster_app.command("create")
def create(
    file: Annotated[Path, typer.Option("--file", "-f", help="The cluster spec (YAML).")],
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Start it and return; do not follow.")
    ] = False,
    as_json: JsonOpt = False,
    agent_gate: Annotated[
        bool,
        typer.Option(
            "--agent-gate/--no-agent-gate",
            help="Gate every node on its health agent's report too (as remediation does); "
            "--no-agent-gate only where no agent runs: Slurm's word is then the gate.",
        ),
    ] = True,
) -> None:
    """Provision the cluster FILE describes and follow it until it is ready (exit 0) or has
    failed (exit 1). A provisioning of that cluster already running is followed instead."""
    from autoclusters.clients import cluster_progress, clusters
    from autoclusters.workflows.cluster_provisioning import ClusterProvisioning

    spec, policy = _load(file)
    out = err if as_json else console  # --json: stdout carries only the document

    async def go(client: Client, s: Settings) -> tuple[clusters.Started, Any]:
        started = await clusters.start_provisioning(client, s, spec, policy, agent_gate)
        if started.attached:
            _say(
                f"cluster {spec.name} is already being provisioned: following "
                f"{started.workflow_id} (nothing new started)",
                to_err=as_json,
            )
        else:
            _say(f"provisioning cluster {spec.name} ({started.workflow_id})", to_err=as_json)
        _say(f"Temporal UI: {started.ui}", to_err=as_json)
        if no_wait:
            return started, None
        state: list[ClusterState | None] = [None]

        def show(st: ClusterState | None) -> None:
            state[0] = st or state[0]
            if not as_json:
                progress.show(st)

        progress = cluster_progress.progress_for(out, spec.name)
        with progress:
            outcome = await clusters.watch(
                client,
                started.workflow_id,
                started.run_id,
                ClusterProvisioning.status,
                ClusterState,
                show,
            )
        return started, (outcome, state[0])

    started, watched = _run(go)
    if watched is None:
        if as_json:
            print(started.model_dump_json())
        return
    outcome, state = watched
    if as_json:
        print(state.model_dump_json() if state else started.model_dump_json())
    if outcome.ok:
        _say(f"cluster {spec.name} is ready", to_err=as_json)
        return
    _say(f"cluster {spec.name} failed: {outcome.message}", to_err=True)
    raise typer.Exit(1)


# --- status --------------------------------------------------------------------------------


@cluster_app.command("status")
def status(cluster: ClusterArg, as_json: JsonOpt = False) -> None:
    """The cluster's provisioning (status, steps, progress, resources, acceptance, guard)
    and whether a scale or teardown runs."""
    from autoclusters.clients import cluster_progress, clusters

    view = _run(lambda c, s: clusters.cluster_view(c, s, cluster))
    if as_json:
        print(view.model_dump_json())
        return
    word = "deleted" if view.deleted else view.temporal_status
    _say(
        f"cluster {view.cluster} on {view.provider} in {view.location}: provisioning {word} "
        f"(started {view.started_at:%Y-%m-%d %H:%M:%S} UTC)"
    )
    _say(f"Temporal UI: {view.ui}")
    st = view.state
    if st is not None:
        console.print(cluster_progress.render(st, view.cluster))
        _steps(st.steps)
        if st.resources:
            _say("resources: " + ", ".join(f"{r.kind} {r.name} ({r.id})" for r in st.resources))
        for a in st.acceptance:
            verdict = "passed" if a.passed else "FAILED"
            _say(f"acceptance {a.node_set}: {verdict} {a.detail}".rstrip())
        if st.guard_workflow_id:
            _say(f"remediation: fleet guard {st.guard_workflow_id}")
    elif view.failure:
        _say(f"failure: {view.failure}")
    if view.ops is None:
        _say("no scale or teardown has run")
        return
    o = view.ops
    verb = "runs" if o.temporal_status == "running" else f"ended {o.temporal_status}"
    _say(f"{o.workflow_type} {verb} ({o.workflow_id}, started {o.started_at:%H:%M:%S})")
    _say(cluster_progress.ops_line(o.state, o.workflow_type))
    _say(f"Temporal UI: {o.ui}")


def _steps(steps: list[Any]) -> None:
    if not steps:
        return
    t = Table("step", "outcome", "started", "finished", "detail")
    for st in steps:
        t.add_row(
            Text(st.name), st.outcome, f"{st.started_at:%H:%M:%S}",
            f"{st.finished_at:%H:%M:%S}" if st.finished_at else "", Text(st.detail),
        )  # fmt: skip
    console.print(t)


# --- scale, delete -------------------------------------------------------------------------


def _follow_ops(client: Client, started: Any) -> Awaitable[Any]:
    from autoclusters.clients import cluster_progress, clusters
    from autoclusters.workflows.cluster_ops import ScaleNodeSet

    last: list[str] = [""]

    def show(st: OpsState | None) -> None:
        line = cluster_progress.ops_line(st, started.workflow_type)
        if line != last[0]:
            _say(line)
            last[0] = line

    # Both ScaleNodeSet and ClusterTeardown answer `status` with an OpsState.
    return clusters.watch(
        client, started.workflow_id, started.run_id, ScaleNodeSet.status, OpsState, show
    )


def _ops(start: Callable[[Client, Settings], Awaitable[Any]], wait: bool, what: str) -> None:
    async def go(client: Client, s: Settings) -> Any:
        started = await start(client, s)
        _say(f"{what} ({started.workflow_type} {started.workflow_id})")
        _say(f"Temporal UI: {started.ui}")
        return await _follow_ops(client, started) if wait else None

    outcome = _run(go)
    if outcome is not None and not outcome.ok:
        _say(f"{what} failed: {outcome.message}", to_err=True)
        raise typer.Exit(1)


@cluster_app.command("scale")
def scale(
    cluster: ClusterArg,
    node_set: Annotated[str, typer.Argument(help="The node set, e.g. gpu.")],
    count: Annotated[int, typer.Argument(min=0, max=10_000, help="Its node count after.")],
    wait: Annotated[bool, typer.Option(help="Follow it until it ends.")] = False,
) -> None:
    """Grow or shrink one node set to COUNT nodes (ScaleNodeSet)."""
    from autoclusters.clients import clusters

    _ops(
        lambda c, s: clusters.start_scale(c, s, cluster, node_set, count),
        wait,
        f"scaling {node_set} of cluster {cluster} to {count}",
    )


@cluster_app.command("delete")
def delete(
    cluster: ClusterArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    wait: Annotated[bool, typer.Option(help="Follow it until it ends.")] = False,
) -> None:
    """Tear the cluster down (ClusterTeardown): drain, then delete its machines, login
    nodes, shared home, accounting and controller."""
    from autoclusters.clients import clusters

    async def start(client: Client, s: Settings) -> clusters.Started:
        await clusters.settled(client, cluster, "delete")  # unknown or busy: before asking
        if not yes:
            typer.confirm(
                f"Delete cluster {cluster}: every node drained, jobs still running after the "
                "grace time cancelled, and all its resources deleted?",
                abort=True,
            )
        return await clusters.start_teardown(client, s, cluster)

    _ops(start, wait, f"deleting cluster {cluster}")


# --- list ----------------------------------------------------------------------------------


@cluster_app.command("list")
def list_cmd(as_json: JsonOpt = False) -> None:
    """The clusters provisioned through this Temporal, newest first."""
    from autoclusters.clients import clusters

    rows = _run(lambda c, s: clusters.list_clusters(c))
    if as_json:
        print("[" + ",".join(r.model_dump_json() for r in rows) + "]")
        return
    t = Table("cluster", "provider", "location", "status", "started")
    for r in rows:
        t.add_row(
            Text(r.name), r.provider, Text(r.location), r.status,
            f"{r.started_at:%Y-%m-%d %H:%M:%S}",
        )  # fmt: skip
    console.print(t)
