"""`autoclusters faults`: the fault catalogue, with what the cluster's policy does for each."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from autoclusters.clients.cli import connect
from autoclusters.clients.cli.output import console, err


def faults(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
) -> None:
    """List the fault kinds AutoClusters knows, with the severity and first rung the
    cluster's policy gives each (its default rule where it names none)."""
    import json

    from autoclusters.core.faults import NAMED_FAULTS, XID_KIND
    from autoclusters.core.policy import PolicyError
    from autoclusters.core.settings import policy_for

    s = connect.load_settings()
    try:
        policy = policy_for(s)
    except PolicyError as e:
        err.print(f"[red]bad policy:[/red] {escape(str(e))}")
        raise typer.Exit(2) from None
    rows = []
    named_xids = sorted(
        (k for k in policy.faults if k.startswith("XID_")), key=lambda k: int(k[4:])
    )
    others = sorted(NAMED_FAULTS | {k for k in policy.faults if not k.startswith("XID_")})
    for kind in [*named_xids, XID_KIND, *others]:
        named = kind in policy.faults
        rule = policy.faults[kind] if named else policy.default_rule
        rows.append(
            {
                "fault": kind,
                "severity": rule.severity,
                "first_rung": rule.first_rung.value,
                "rule": "policy" if named else "default",
            }
        )
    if as_json:
        print(json.dumps(rows))
        return
    t = Table("fault", "severity", "first rung", "rule")
    for r in rows:
        t.add_row(r["fault"], r["severity"], r["first_rung"], r["rule"])
    console.print(t)
    console.print(
        f"{XID_KIND}: any driver Xid the policy does not name; "
        "a cluster's policy may name more kinds.",
        markup=False,
    )
