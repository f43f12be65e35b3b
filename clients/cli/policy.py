"""`autoclusters policy`: check a remediation policy file before a cluster uses it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoclusters.core.policy import LADDER, PolicyError, load_policy

policy_app = typer.Typer(no_args_is_help=True, help="Check remediation policy files.")


@policy_app.callback()
def _group() -> None:
    # Keeps `check` a named sub-command even while it is the only one.
    pass


@policy_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="The policy YAML file, e.g. policy.yaml.")],
) -> None:
    """Validate FILE and print a summary; on errors print each with its line, exit 2."""
    try:
        policy = load_policy(file)
    except PolicyError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None
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
