"""`autoclusters incident open|list|show` and `autoclusters approve`: incidents, for operators.

Exit codes: 0 done; 1 no such incident (or not started yet), Temporal not reachable, or
`list` could not read one kind of incident (the other listed, the unknown one said);
2 refused (an unknown fault kind, a request Slurm or the policy refuses) or bad settings;
3 a decision the incident refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, get_args

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.table import Table

from autoclusters.clients.cli import connect
from autoclusters.clients.cli.output import console, err, steps_table
from autoclusters.core.models import IncidentStateName
from autoclusters.core.settings import Settings

if TYPE_CHECKING:  # imported where used: the CLI starts without the clients it may not need
    from autoclusters.clients.incident_listing import SystemicSummary
    from autoclusters.clients.incidents import IncidentSummary

incident_app = typer.Typer(no_args_is_help=True, help="Open, list and read incidents.")

# Options whose value is one of a fixed set are typed as that set: anything else is Typer's
# usage error (exit 2, naming the allowed values) before a query or a workflow sees it.
# The incident's own states plus the search attribute's `waiting_approval`
# (core.models.IncidentStateName); tests/cli/test_cli_choices.py keeps them in step.
# What a human approves: the rungs (core.policy.LADDER less `monitor`, which repairs
# nothing), and jobs back on the node after their requeue (approve: cancel them; reject:
# wait for them; core.models.RETURNED_JOBS_STEP).
ApprovalStep = Literal["reset_gpu", "reboot", "replace", "returned_jobs"]


@incident_app.command("open")
def incident_open(
    node: Annotated[str, typer.Option(help="The faulty node, e.g. gpu-02.")],
    fault: Annotated[str, typer.Option(help="Fault kind, e.g. XID_79.")],
    wait: Annotated[bool, typer.Option(help="Wait until the incident closes.")] = False,
) -> None:
    """Open an incident on a node (or join the one already open on it)."""
    from autoclusters.clients import incidents
    from autoclusters.core.faults import UnknownFaultError
    from autoclusters.core.policy import PolicyError
    from autoclusters.integrations.slurm import SlurmError

    s = connect.load_settings()
    _refuse_unknown_fault(s, fault)  # before Temporal is asked anything

    async def go(client: Any, s: Settings) -> incidents.OpenedIncident:
        opened = await incidents.open_incident(client, s, node, fault)
        if wait:
            handle = client.get_workflow_handle(opened.workflow_id, run_id=opened.run_id)
            try:
                await handle.result()
            except Exception as e:  # the incident failed; show it below
                err.print(f"[red]incident failed:[/red] {getattr(e, 'cause', None) or e}")
        return opened

    try:
        opened = connect.run_client(go)
    except ValidationError as e:
        err.print(f"[red]refused:[/red] {_first_error(e)}")
        raise typer.Exit(2) from None
    except (SlurmError, PolicyError, UnknownFaultError) as e:
        _refused(str(e))
    verb = "joined open incident" if opened.joined else "opened"
    console.print(f"{verb} {opened.incident_id} (workflow {opened.workflow_id})")
    if wait:
        _show(opened.incident_id, as_json=False)


def _refuse_unknown_fault(s: Settings, fault: str) -> None:
    """Exit 2 with one line (pointing at `autoclusters faults`) for a kind nobody knows."""
    from autoclusters.core.faults import UnknownFaultError, check_known_fault
    from autoclusters.core.policy import PolicyError
    from autoclusters.core.settings import policy_for

    try:
        check_known_fault(fault, policy_for(s).faults)
    except (UnknownFaultError, PolicyError) as e:
        _refused(str(e))


def _refused(message: str) -> NoReturn:
    """`refused: MESSAGE` on stderr, exit 2; a one-line message stays one line."""
    err.print(f"[red]refused:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


def _first_error(e: ValidationError) -> str:
    first = e.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"


@incident_app.command("list")
def incident_list(
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON array, each incident with its `kind`.")
    ] = False,
    state: Annotated[
        IncidentStateName | None,
        typer.Option(
            metavar="STATE",
            help=f"Only incidents in this state: {', '.join(get_args(IncidentStateName))}.",
        ),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(help="Only this node's incidents, and the systemic ones it is a member of."),
    ] = None,
    fault: Annotated[str | None, typer.Option(help="Only incidents opened for this fault.")] = None,
) -> None:
    """List the cluster's incidents, the nodes' and the systemic ones, newest first. Exit 1
    when either kind could not be read (the other is still listed)."""
    from autoclusters.clients import incident_listing

    listing = connect.run_client(
        lambda c, s: incident_listing.list_all_incidents(c, s, state=state, node=node, fault=fault)
    )
    rows = listing.incidents
    if as_json:
        print("[" + ",".join(r.model_dump_json() for r in rows) + "]")
    else:
        t = Table("incident", "kind", "node", "fault", "state", "action", "started", "closed")
        for r in rows:
            t.add_row(*_row(r))
        console.print(t)
    for half in listing.unknown:  # never an empty list where a read failed
        what = "node incidents" if half.kind == "node" else "systemic incidents"
        err.print(f"[red]{what}: unknown[/red] (not read: {escape(half.reason)})", soft_wrap=True)
    if listing.unknown:
        raise typer.Exit(1)


def _row(r: IncidentSummary | SystemicSummary) -> list[str]:
    """A row of `incident list`: a systemic incident's node cell is its domain and members,
    its fault cell its members' faults."""
    when = [f"{t:%Y-%m-%d %H:%M:%S}" if t else "" for t in (r.started_at, r.closed_at)]
    if r.kind == "node":
        return [r.incident_id, "node", r.node, r.fault, r.state or r.status, r.action, *when]
    domain = f"{r.level or '?'} {r.domain}"
    if r.members is None:
        return [r.incident_id, "systemic", f"{domain}: members unknown", "?", r.state, "", *when]
    nodes = ", ".join(m.node for m in r.members)
    faults = ", ".join(dict.fromkeys(m.fault for m in r.members if m.fault))
    return [r.incident_id, "systemic", f"{domain}: {nodes}", faults, r.state, "", *when]


def approve(
    incident_id: Annotated[str, typer.Argument(help="The incident waiting for a decision.")],
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approve.")] = False,
    comment: Annotated[str, typer.Option(help="Why, for the record.")] = "",
    step: Annotated[
        ApprovalStep | None,
        typer.Option(
            metavar="STEP",
            help=f"The step you mean ({', '.join(get_args(ApprovalStep))}): refused unless "
            "the incident waits on exactly that one.",
        ),
    ] = None,
) -> None:
    """Approve (or reject) the step an incident is waiting on, as the person whose operator
    token AUTOCLUSTERS_API_TOKEN is (through the API); says which step before deciding."""
    from autoclusters.clients import incidents
    from autoclusters.clients.cli.decisions import DecisionError, post_decision

    verb = "approving" if not reject else "rejecting"

    async def look(client: Any, s: Settings) -> Any:
        handle = await incidents.find_incident(client, s, incident_id)
        state, _ = await incidents.incident_state(handle)
        return state

    try:
        state = connect.run_client(look)
    except incidents.IncidentNotFound as e:
        err.print(str(e))
        raise typer.Exit(1) from None
    if state is not None and state.waiting_for and state.waiting_for.kind == "approval":
        r = state.request
        shown = step or state.waiting_for.step
        console.print(f"{verb} {shown} of {r.node} ({r.fault}, incident {incident_id})")
    try:
        rec = post_decision(connect.load_settings(), incident_id, not reject, comment, step)
    except DecisionError as e:
        err.print(f"[red]refused:[/red] {escape(str(e))}" if e.code == 3 else escape(str(e)))
        raise typer.Exit(e.code) from None
    verb = "approved" if rec.approved else "rejected"
    console.print(f"{rec.step} of {incident_id} {verb} by {rec.approver}")


@incident_app.command("show")
def incident_show(
    incident_id: Annotated[
        str, typer.Argument(help="Incident id, e.g. inc-20261129-201630-gpu-02.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show one incident: its steps with start and finish times (a systemic incident: its
    domain, members and hand-off too)."""
    _show(incident_id, as_json)


def _show(incident_id: str, as_json: bool) -> None:
    from autoclusters.clients import incidents, systemic_incidents
    from autoclusters.clients.cli.systemic import show_systemic

    async def go(client: Any, s: Settings) -> Any:
        handle = await incidents.find_incident(client, s, incident_id)
        # A systemic incident (docs/systemic.md) has an id of the same shape.
        systemic = await systemic_incidents.systemic_read(handle)
        if systemic is not None:
            return systemic, ""
        return await incidents.incident_state(handle)

    try:
        state, wf_status = connect.run_client(go)
    except incidents.IncidentNotFound as e:
        err.print(str(e))
        raise typer.Exit(1) from None
    if isinstance(state, systemic_incidents.SystemicRead):
        show_systemic(state, as_json=as_json)
        return
    if state is None:
        err.print(f"{incident_id}: not started yet (temporal status {wf_status})")
        raise typer.Exit(1)
    if as_json:
        print(state.model_dump_json())
        return
    r = state.request
    console.print(
        f"[bold]{r.incident_id}[/bold]  node {r.node}  fault {r.fault}  status {state.status}"
        f"  mode {state.mode}  rung {state.rung or '-'}"
        + (f"  error: {state.error}" if state.error else "")
    )
    if len(state.faults) > 1 or (state.faults and state.faults[0].count > 1):
        seen = ", ".join(f"{f.fault} x{f.count}" for f in state.faults)
        console.print(f"faults: {seen}")
    for f in state.faults:  # what the sources said: summary, runbook, when it started
        for ev in f.evidence[:1]:
            since = f" since {ev.starts_at:%Y-%m-%d %H:%M:%S} UTC" if ev.starts_at else ""
            console.print(f"{f.fault} ({ev.source}{since}): {ev.headline() or '-'}", markup=False)
        if f.resolved_at is not None:
            console.print(f"{f.fault} cleared at {f.resolved_at:%H:%M:%S} ({f.resolved_by})")
    if state.waiting_for:
        w = state.waiting_for
        console.print(f"[yellow]waiting for {w.kind}[/yellow] {w.step or ''} {w.detail}")
    for a in state.approvals:
        verb = "approved" if a.approved else "rejected"
        console.print(f"{a.step} {verb} by {a.approver} at {a.at:%H:%M:%S} {a.comment}")
    for x in state.refusals:
        console.print(f"[red]refused[/red] {x.approver} on {x.step}: {x.reason}")
    for j in state.vanished_jobs:  # lost by a restarted controller: a person resubmits
        err.print(f"job {j.job_id} ({j.name}) lost by the Slurm controller: {j.how_to_resubmit()}",
                  markup=False, style="red")  # fmt: skip
    for line in state.planned_steps:
        console.print(f"plan: {line}")
    console.print(steps_table(state.steps))
