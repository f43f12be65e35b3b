"""`autoclusters sandbox slack`: click the sandbox's Slack buttons, read its channel.

Both talk to the Slack emulator (`sandbox/slack/emulator.py`). `click` goes the real way:
the emulator signs a block_actions payload and POSTs it to the API's interactivity
endpoint, and this prints what that endpoint answered. `log` prints the channel as a
reader sees it: each incident's message, then its thread replies in order.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

import httpx
import typer

__all__ = ["blocks_text", "emulator_root", "render_channel", "slack_app"]

slack_app = typer.Typer(
    no_args_is_help=True, help="The sandbox's Slack: click incident buttons, read the channel."
)

SlackUrl = Annotated[
    str | None,
    typer.Option(
        "--slack-url",
        envvar="AUTOCLUSTERS_SLACK_API_URL",
        help="The Slack emulator's Web API URL, e.g. http://127.0.0.1:8790/api/",
    ),
]


def emulator_root(url: str | None) -> str:
    """The emulator's root from its Web API URL (…/api/ is what slack-sdk is given)."""
    if not url:
        # The settings (a running sandbox's) know where its Slack is.
        from autoclusters.core.settings import load

        slack = load().slack
        url = slack.base_url if slack is not None else None
    if not url:
        typer.echo("set --slack-url or AUTOCLUSTERS_SLACK_API_URL", err=True)
        raise typer.Exit(2)
    root = url.rstrip("/")
    return root.removesuffix("/api")


def _request(method: str, url: str, **kw: Any) -> httpx.Response:
    try:
        with httpx.Client(timeout=60, trust_env=False) as http:
            return http.request(method, url, **kw)
    except httpx.HTTPError as e:
        typer.echo(f"the Slack emulator at {url} cannot be reached: {e}", err=True)
        raise typer.Exit(2) from None


@slack_app.command("click")
def click(
    incident: Annotated[str, typer.Option("--incident", help="The incident id.")],
    action: Annotated[str, typer.Option("--action", help="approve or reject.")],
    as_user: Annotated[str, typer.Option("--as", help="The Slack user id clicking, U123.")],
    slack_url: SlackUrl = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw answer.")] = False,
) -> None:
    """Click Approve or Reject on INCIDENT's message as a Slack user.

    Exit 0 when the decision was taken, 1 when it was refused, 2 when nothing was clicked.
    """
    if action not in ("approve", "reject"):
        typer.echo("--action must be approve or reject", err=True)
        raise typer.Exit(2)
    root = emulator_root(slack_url)
    body = {"incident_id": incident, "action": action, "user": as_user}
    resp = _request("POST", f"{root}/_emulator/click", json=body)
    json_answer = resp.headers.get("content-type", "").startswith("application/json")
    answer = resp.json() if json_answer else {}
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
    if resp.status_code != 200:
        typer.echo(f"no click: {answer.get('error', resp.text)}", err=True)
        raise typer.Exit(2)
    status, result = answer.get("status"), answer.get("body")
    outcome = result.get("outcome") if isinstance(result, dict) else None
    if not as_json:
        reason = result.get("reason") if isinstance(result, dict) else None
        line = f"{action} {incident} as {as_user}: HTTP {status}, {outcome or result}"
        typer.echo(line + (f" ({reason})" if reason else ""))
    if outcome not in ("approved", "rejected"):
        raise typer.Exit(1)


@slack_app.command("log")
def log(
    slack_url: SlackUrl = None,
    channel: Annotated[str, typer.Option("--channel", help="Channel name or id.")] = "incidents",
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw channel.")] = False,
) -> None:
    """Print the channel: each message, its thread replies in order, ephemeral answers."""
    root = emulator_root(slack_url)
    resp = _request("GET", f"{root}/_emulator/channels/{channel}")
    if resp.status_code != 200:
        typer.echo(f"no channel {channel}: {resp.text}", err=True)
        raise typer.Exit(2)
    view = resp.json()
    typer.echo(json.dumps(view, indent=2) if as_json else render_channel(view))


def render_channel(view: dict[str, Any]) -> str:
    """The emulator's channel view as plain text (no markup: ids hold brackets)."""
    lines = [f"#{view['name']} ({view['id']})"]
    if not view["messages"]:
        lines.append("  (no messages)")
    for m in view["messages"]:
        edited = f"  [updated {m['edits']}x]" if m.get("edits") else ""
        lines.append("")
        lines.append(f"{_clock(m['ts'])}{edited}")
        lines.extend("  " + t for t in blocks_text(m.get("blocks") or []) or [m["text"]])
        for r in m.get("replies") or []:
            broadcast = " (also sent to the channel)" if r.get("reply_broadcast") else ""
            lines.append(f"  └ {_clock(r['ts'])} {r['text']}{broadcast}")
    if view.get("ephemeral"):
        lines.append("")
        lines.append("only visible to one user:")
        for e in view["ephemeral"]:
            lines.append(f"  {_clock(e['ts'])} to {e['user']}: {e['text']}")
    return "\n".join(lines)


def blocks_text(blocks: list[dict[str, Any]]) -> list[str]:
    """Block Kit as lines of text: headers, sections, fields, context, buttons."""
    out: list[str] = []
    for b in blocks:
        kind = b.get("type")
        if kind in ("header", "section") and b.get("text"):
            out.append(str(b["text"].get("text", "")))
        if kind == "section" and b.get("fields"):
            out.append(" | ".join(f["text"].replace("\n", ": ") for f in b["fields"]))
        if kind == "context":
            out.append(" ".join(str(e.get("text", "")) for e in b.get("elements", [])))
        if kind == "actions":
            labels = [e.get("text", {}).get("text", "?") for e in b.get("elements", [])]
            out.append(" ".join(f"[{label}]" for label in labels))
    return out


def _clock(ts: str) -> str:
    return datetime.fromtimestamp(float(ts), UTC).strftime("%H:%M:%S")
