"""`autoclusters`: the operator's command line."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from typing import Annotated, Any, Literal, NoReturn, TypeVar, get_args

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autoclusters.clients.agent_cli import agent_app, inject_app
from autoclusters.clients.api_cli import api_app
from autoclusters.clients.breaker import breaker_app
from autoclusters.clients.cluster_cli import cluster_app
from autoclusters.clients.console_cli import console as console_command
from autoclusters.clients.policy_cli import policy_app
from autoclusters.clients.share_cli import share_app
from autoclusters.core import settings as settings_mod
from autoclusters.core.models import IncidentStateName
from autoclusters.core.settings import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)
incident_app = typer.Typer(no_args_is_help=True, help="Open, list and read incidents.")
app.add_typer(incident_app, name="incident")
app.add_typer(breaker_app, name="breaker")
app.add_typer(policy_app, name="policy")
app.add_typer(cluster_app, name="cluster")
app.add_typer(share_app, name="share")
app.add_typer(agent_app, name="agent")
app.add_typer(inject_app, name="inject")
app.add_typer(api_app, name="api")
app.command("console")(console_command)

console = Console()
err = Console(stderr=True)
T = TypeVar("T")

# Options whose value is one of a fixed set are typed as that set: anything else is Typer's
# usage error (exit 2, naming the allowed values) before a query or a workflow sees it.
# The incident's own states plus the search attribute's `waiting_approval`
# (core.models.IncidentStateName); tests/test_cli_choices.py keeps them in step.
# What a human approves: the rungs (core.policy.LADDER less `monitor`, which repairs
# nothing), and jobs back on the node after their requeue (approve: cancel them; reject:
# wait for them; core.models.RETURNED_JOBS_STEP).
ApprovalStep = Literal["reset_gpu", "reboot", "replace", "returned_jobs"]


def _settings() -> Settings:
    try:
        return settings_mod.load()
    except ValidationError as e:
        err.print(f"[red]bad settings:[/red] {e}")
        raise typer.Exit(2) from None


def _run_client(fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run `fn(client)` against the configured Temporal; say clearly when it is not there."""
    from autoclusters.integrations import temporal

    async def go() -> T:
        client = await temporal.connect(_settings())
        return await fn(client)

    try:
        return asyncio.run(go())
    except RuntimeError as e:
        if "Failed client connect" in str(e) or "connect" in str(e).lower():
            s = _settings()
            err.print(
                f"[red]cannot reach Temporal at {s.temporal_address}[/red]: is the sandbox up? "
                "(`autoclusters sandbox up`)"
            )
            raise typer.Exit(1) from None
        raise


@app.command("worker")
def worker() -> None:
    """Run a worker hosting the remediation workflow and its activities."""
    from autoclusters.workers.remediation import run

    s = _settings()
    logging.basicConfig(
        level=s.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stdout,
    )
    asyncio.run(run(s))


# --- incidents ----------------------------------------------------------------------------


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

    s = _settings()
    _refuse_unknown_fault(s, fault)  # before Temporal is asked anything

    async def go(client: Any) -> incidents.OpenedIncident:
        opened = await incidents.open_incident(client, s, node, fault)
        if wait:
            handle = client.get_workflow_handle(opened.workflow_id, run_id=opened.run_id)
            try:
                await handle.result()
            except Exception as e:  # the incident failed; show it below
                err.print(f"[red]incident failed:[/red] {getattr(e, 'cause', None) or e}")
        return opened

    try:
        opened = _run_client(go)
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
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
    state: Annotated[
        IncidentStateName | None,
        typer.Option(
            metavar="STATE",
            help=f"Only incidents in this state: {', '.join(get_args(IncidentStateName))}.",
        ),
    ] = None,
    node: Annotated[str | None, typer.Option(help="Only this node's incidents.")] = None,
    fault: Annotated[str | None, typer.Option(help="Only incidents opened for this fault.")] = None,
) -> None:
    """List the cluster's incidents, newest first."""
    from autoclusters.clients import incidents

    s = _settings()
    rows = _run_client(
        lambda c: incidents.list_incidents(c, s, state=state, node=node, fault=fault)
    )
    if as_json:
        print("[" + ",".join(r.model_dump_json() for r in rows) + "]")
        return
    t = Table("incident", "node", "fault", "state", "action", "started", "closed")
    for r in rows:
        t.add_row(
            r.incident_id, r.node, r.fault, r.state or r.status, r.action,
            f"{r.started_at:%Y-%m-%d %H:%M:%S}" if r.started_at else "",
            f"{r.closed_at:%Y-%m-%d %H:%M:%S}" if r.closed_at else "",
        )  # fmt: skip
    console.print(t)


@app.command("approve")
def approve(
    incident_id: Annotated[str, typer.Argument(help="The incident waiting for a decision.")],
    as_user: Annotated[str, typer.Option("--as", help="Who decides (must be an approver).")],
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
    """Approve (or reject) the step an incident is waiting on; says which before deciding."""
    from autoclusters.clients import incidents

    s = _settings()
    verb = "approving" if not reject else "rejecting"

    async def go(client: Any) -> Any:
        handle = await incidents.find_incident(client, s, incident_id)
        state, _ = await incidents.incident_state(handle)
        if state is not None and state.waiting_for and state.waiting_for.kind == "approval":
            r = state.request
            shown = step or state.waiting_for.step
            console.print(f"{verb} {shown} of {r.node} ({r.fault}, incident {incident_id})")
        return await incidents.decide(client, s, incident_id, as_user, not reject, comment, step)

    try:
        rec = _run_client(go)
    except incidents.IncidentNotFound as e:
        err.print(str(e))
        raise typer.Exit(1) from None
    except incidents.DecisionRefused as e:
        err.print(f"[red]refused:[/red] {e}")
        raise typer.Exit(3) from None
    verb = "approved" if rec.approved else "rejected"
    console.print(f"{rec.step} of {incident_id} {verb} by {rec.approver}")


@incident_app.command("show")
def incident_show(
    incident_id: Annotated[
        str, typer.Argument(help="Incident id, e.g. inc-20261129-201630-gpu-02.")
    ],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Show one incident: its steps with start and finish times."""
    _show(incident_id, as_json)


def _show(incident_id: str, as_json: bool) -> None:
    from autoclusters.clients import incidents

    s = _settings()

    async def go(client: Any) -> Any:
        handle = await incidents.find_incident(client, s, incident_id)
        return await incidents.incident_state(handle)

    try:
        state, wf_status = _run_client(go)
    except incidents.IncidentNotFound as e:
        err.print(str(e))
        raise typer.Exit(1) from None
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
    for line in state.planned_steps:
        console.print(f"plan: {line}")
    t = Table("step", "outcome", "started", "finished", "seconds", "detail")
    for st in state.steps:
        secs = (st.finished_at - st.started_at).total_seconds() if st.finished_at else None
        t.add_row(
            st.name, st.outcome, f"{st.started_at:%H:%M:%S.%f}"[:-3],
            f"{st.finished_at:%H:%M:%S.%f}"[:-3] if st.finished_at else "",
            f"{secs:.2f}" if secs is not None else "", st.detail,
        )  # fmt: skip
    console.print(t)


# --- the fault catalogue -----------------------------------------------------------------


@app.command("faults")
def faults(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
) -> None:
    """List the fault kinds AutoClusters knows, with the severity and first rung the
    cluster's policy gives each (its default rule where it names none)."""
    import json

    from autoclusters.core.faults import NAMED_FAULTS, XID_KIND
    from autoclusters.core.policy import PolicyError
    from autoclusters.core.settings import policy_for

    s = _settings()
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


def _plugins() -> None:
    """Commands other installed parts add (the sandbox: `sandbox ...`, `demo`, `chaos`),
    found through the `autoclusters.cli` entry points: this module imports none of them,
    and an install without them (the worker image) simply lacks those commands."""
    for ep in entry_points(group="autoclusters.cli"):
        try:
            register = ep.load()
        except ImportError as e:  # the part is not installed here (its extra is missing)
            logging.getLogger("autoclusters.cli").debug("no %s commands: %s", ep.name, e)
            continue
        register(app)


def main() -> None:
    # Temporal's Rust threads can crash a finishing interpreter (sdk-python#300): flush and
    # leave with os._exit so the exit code is the command's own.
    rc = 0
    try:
        _plugins()
        app()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


if __name__ == "__main__":
    main()
