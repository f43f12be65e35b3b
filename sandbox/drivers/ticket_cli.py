"""`autoclusters sandbox ticket`: the provider's ticket desk of the sandbox (docs/handoff.md).

`serve` starts the desk (sandbox/crusoe/ticket_desk.py) on port_base + 97, recorded in the
sandbox's process table (so `sandbox down` stops it), and turns the hand-off on in the
sandbox's policy (the API reads the policy again when its file changes: incidents opened
from then on hand off). `list` shows the desk's tickets; `answer` plays the provider: the
desk signs the answer with the shared secret and POSTs it to the API.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml

from autoclusters.core.settings import DEFAULT_SANDBOX_DIR

__all__ = ["ticket_app"]

DESK = "ticket-desk"

ticket_app = typer.Typer(
    no_args_is_help=True,
    help="The provider's ticket desk: receive hand-offs, answer them (fixed, replaced, declined).",
)

StateDir = Annotated[
    Path, typer.Option("--state-dir", help="Where the sandbox keeps its state, logs and PIDs.")
]


def _cfg(state_dir: Path) -> Any:
    from autoclusters.sandbox import cluster as sb
    from autoclusters.sandbox.runtime.daemons import SandboxError

    try:
        return sb.load(state_dir.absolute())
    except SandboxError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


def _request(method: str, url: str, **kw: Any) -> httpx.Response:
    try:
        with httpx.Client(timeout=60, trust_env=False) as http:
            return http.request(method, url, **kw)
    except httpx.HTTPError as e:
        typer.echo(f"the ticket desk at {url} cannot be reached ({e}); "
                   "start it with `autoclusters sandbox ticket serve`", err=True)  # fmt: skip
        raise typer.Exit(2) from None


@ticket_app.command("serve")
def serve(
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
    enable: Annotated[
        bool, typer.Option(help="Turn the hand-off on in the sandbox's policy.")
    ] = True,
    reminder_s: Annotated[
        float, typer.Option("--reminder-s", help="The reminders' interval, seconds.")
    ] = 600,
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="A fault kind handed off at once (handoff.faults); repeat."),
    ] = None,
) -> None:
    """Start the ticket desk and point the sandbox's hand-offs at it."""
    import sys

    from autoclusters.sandbox.runtime import daemons
    from autoclusters.sandbox.runtime.processes import ProcessTable, wait_until

    cfg = _cfg(state_dir)
    secret = cfg.handoff_secret_file
    if not secret.exists():
        typer.echo(f"{secret} is missing: a sandbox from before the hand-off; "
                   "`sandbox down` then `sandbox up` makes one", err=True)  # fmt: skip
        raise typer.Exit(2)
    table = ProcessTable(cfg.state_dir)
    if not table.alive(DESK):
        argv = [
            sys.executable, "-m", "autoclusters.sandbox.crusoe.ticket_desk",
            "--port", str(cfg.ticket_desk_port), "--secret-file", str(secret),
            "--state", str(secret.parent / "tickets.json"),
        ]  # fmt: skip
        table.spawn(DESK, argv)
        if not wait_until(lambda: daemons.port_open(cfg.ticket_desk_port), 30, 0.2):
            typer.echo(f"the ticket desk did not start:\n{table.log_tail(DESK)}", err=True)
            raise typer.Exit(1)
    url = f"{cfg.ticket_desk_url}/tickets"
    if enable:
        policy = yaml.safe_load(cfg.policy_file.read_text())
        policy["handoff"] = {
            **policy.get("handoff", {}),
            "enabled": True,
            "url": url,
            "reminder_interval_s": reminder_s,
            "when": ["health_gate_failed", "lemon"],
            "faults": sorted(set(fault or [])),
        }
        from autoclusters.core.policy import PolicyError, parse_policy

        text = "# `autoclusters sandbox ticket serve` turned the hand-off on.\n"
        text += yaml.safe_dump(policy, sort_keys=False)
        try:
            parse_policy(text, str(cfg.policy_file))  # never leave the API a broken policy
        except PolicyError as e:
            typer.echo(str(e), err=True)
            raise typer.Exit(2) from None
        cfg.policy_file.write_text(text)
    typer.echo(f"ticket desk: {url} (tickets: autoclusters sandbox ticket list)")
    if enable:
        typer.echo(f"hand-off on in {cfg.policy_file}: incidents opened from now on hand off")


@ticket_app.command("list")
def list_tickets(
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw tickets.")] = False,
) -> None:
    """The desk's tickets: one per incident handed off, with its deliveries and answers."""
    cfg = _cfg(state_dir)
    tickets = _request("GET", f"{cfg.ticket_desk_url}/_desk/tickets").json()
    if as_json:
        typer.echo(json.dumps(tickets, indent=2))
        return
    if not tickets:
        typer.echo("no tickets")
    for t in tickets:
        req = t["request"]
        answers = ", ".join(a["answer"] for a in t["answers"]) or "unanswered"
        typer.echo(
            f"{t['ticket']}  {t['incident_id']}  {req['node']} {req['fault']} "
            f"({req['reason']}); deliveries {t['deliveries']}; {answers}"
        )


@ticket_app.command("answer")
def answer(
    incident: Annotated[str, typer.Argument(help="The incident id the ticket is for.")],
    fixed: Annotated[bool, typer.Option("--fixed", help="The machine is mended.")] = False,
    replaced: Annotated[
        bool, typer.Option("--replaced", help="A new machine is behind the node.")
    ] = False,
    declined: Annotated[bool, typer.Option("--declined", help="Not the provider's.")] = False,
    note: Annotated[str, typer.Option("--note", help="What the provider says.")] = "",
    new_vm_id: Annotated[
        str | None, typer.Option("--new-vm-id", help="replaced: the new machine's id.")
    ] = None,
    state_dir: StateDir = DEFAULT_SANDBOX_DIR,
) -> None:
    """Answer INCIDENT's ticket as the provider: exactly one of --fixed, --replaced,
    --declined. Exit 0 when the API took it, 1 when it refused, 2 when nothing was sent."""
    chosen = [k for k, on in (("fixed", fixed), ("replaced", replaced), ("declined", declined))
              if on]  # fmt: skip
    if len(chosen) != 1:
        typer.echo("give exactly one of --fixed, --replaced, --declined", err=True)
        raise typer.Exit(2)
    cfg = _cfg(state_dir)
    body: dict[str, Any] = {"answer": chosen[0], "note": note, "new_vm_id": new_vm_id}
    r = _request("POST", f"{cfg.ticket_desk_url}/_desk/tickets/{incident}/answer", json=body)
    said = r.json()
    if r.status_code != 200:
        typer.echo(f"not sent: {said.get('error', said)}", err=True)
        raise typer.Exit(2)
    typer.echo(f"the API answered {said['status']}: {json.dumps(said['body'])}")
    if said["status"] != 200:
        raise typer.Exit(1)
