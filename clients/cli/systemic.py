"""`autoclusters incident show <systemic id>`: a systemic incident (docs/systemic.md) as an
operator reads it: its domain, its members (node, incident, drained, screen, verdict), the
hand-off to the provider, its steps."""

from __future__ import annotations

from rich.table import Table

from autoclusters.clients.cli.output import console
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
    steps = Table("step", "outcome", "started", "finished", "seconds", "detail")
    for st in state.steps:
        secs = (st.finished_at - st.started_at).total_seconds() if st.finished_at else None
        steps.add_row(
            st.name, st.outcome, f"{st.started_at:%H:%M:%S.%f}"[:-3],
            f"{st.finished_at:%H:%M:%S.%f}"[:-3] if st.finished_at else "",
            f"{secs:.2f}" if secs is not None else "", st.detail,
        )  # fmt: skip
    console.print(steps)
