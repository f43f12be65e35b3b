"""`autoclusters cluster`: cluster specs (and, to come, create / status / scale / delete)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoclusters.core.cluster_spec import ClusterSpecError, load_cluster_spec

cluster_app = typer.Typer(no_args_is_help=True, help="Slurm clusters described by a spec.")


@cluster_app.callback()
def _group() -> None:
    # Keeps `validate` a named sub-command even while it is the only one.
    pass


@cluster_app.command("validate")
def validate(
    file: Annotated[Path, typer.Argument(help="The cluster spec, e.g. examples/clusters/x.yaml.")],
) -> None:
    """Check FILE (and the policy it attaches): each problem as file:line: field: message,
    exit 2; or a one-line summary, exit 0."""
    try:
        spec, policy = load_cluster_spec(file)
    except ClusterSpecError as e:
        # Plain echo, not rich: field paths such as node_sets[0] would read as markup.
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
    sets = ", ".join(f"{s.name}×{s.count} ({s.instance_type})" for s in spec.node_sets)
    typer.echo(
        f"{file}: OK: cluster {spec.name} on {spec.provider} in {spec.location}: "
        f"{len(spec.nodes())} nodes [{sets}], {spec.login.count} login, "
        f"accounting {'on' if spec.accounting else 'off'}, {len(spec.users)} users, "
        f"policy mode {policy.mode}"
    )
