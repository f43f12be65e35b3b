"""`autoclusters incident show <systemic id>`: a systemic incident (docs/systemic.md) as an
operator reads it: its domain, its members (node, incident, drained, screen, verdict), the
hand-off to the provider, its steps."""

from __future__ import annotations

from rich.table import Table

from autoclusters.clients.cli.output import console, steps_table
from autoclusters.clients.systemic_incidents import SystemicRead, handoff_text, screen_text


def show_systemic(read: SystemicRead, *, as_json: bool) -> None:
    state = read.state
    if as_json:
        print(read.model_dump_json())
        return
    r = state.request
    console.print(
        f"[bold]{r.incident_id}[/bold]  systemic: {r.level} {r.domain}  status {state.status}"
        f"  ({len(state.members)} members)" + (f"  error: {state.error}" if state.error else ""),
        soft_wrap=True,
    )
    console.print(f"opened {r.opened_at:%Y-%m-%d %H:%M:%S} UTC  workflow {read.workflow_id} "
                  f"({read.temporal_status})", markup=False, soft_wrap=True)  # fmt: skip
    if state.waiting_for:
        w = state.waiting_for
        console.print(f"waiting for {w.kind} {w.step or ''} {w.detail}", markup=False)
    console.print(f"hand-off: {handoff_text(state.handoff, state.waiting_for)}", markup=False)
    members = Table("node", "incident", "drained", "screen", "verdict", "detail")
    for m in state.members:
        members.add_row(
            m.node, m.incident_id or "(not joined)", "yes" if m.drained else "no",
            screen_text(m), m.verdict or "-", m.detail,
        )  # fmt: skip
    console.print(members)
    console.print(steps_table(state.steps))
