"""Slack over real HTTP: slack-sdk's AsyncWebClient against the Slack emulator on loopback.

Aspects covered:
- the notifier posts one message per incident, updates it in place at every event and
  tells each event as a thread reply, in order; links to the workflow and the incident;
- approval_needed carries Approve / Reject buttons (incident + step); the next event
  takes them away; a critical event mentions the paging group and is broadcast;
- the message survives a restart (the file store) and a worker with no store (the
  channel history, by metadata); a retried event is not told twice; a deleted message
  is posted anew;
- 429 with Retry-After is waited out and retried; errors, 5xx, a hung Slack and an
  unreachable one make `send` return within its bound without raising;
- interactivity: a signed click decides as the mapped approver (or a group member) and
  replaces the buttons; a forged, stale or future signature is 401 and decides nothing;
  a user not allowed, or a refused decision, gets an ephemeral answer; Socket Mode feeds
  the same handler;
- the emulator's /_emulator/click sends a payload that verifies; the `sandbox slack` CLI;
- MultiNotifier isolates a failing or hung notifier; WebhookNotifier signs its POSTs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode.request import SocketModeRequest
from typer.testing import CliRunner

from autoclusters.clients.incidents import DecisionRefused, IncidentNotFound
from autoclusters.core.models import Notification
from autoclusters.integrations.slack import (
    ApproverDirectory,
    FileThreadStore,
    InteractionHandler,
    Links,
    MemoryThreadStore,
    MultiNotifier,
    SlackNotifier,
    SocketModeRunner,
    ThreadRecord,
    WebhookNotifier,
    slack_web_client,
)
from autoclusters.integrations.slack.cards import IncidentCard
from autoclusters.integrations.slack.fanout import webhook_signature
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.sandbox.slack.cli import slack_app
from autoclusters.sandbox.slack.emulator import EmulatorConfig, create_app

TOKEN = "xoxb-test-token"
SECRET = "test-signing-secret"
CHANNEL = "C00000001"  # the emulator's first channel, #incidents
PAGERS = "S0PAGERS"
APPROVERS_GROUP = "S0APPROVERS"
INCIDENT = "inc-20260501-100000-gpu-01"
UI, API = "http://temporal.test:8233", "http://api.test:8000"


def note(
    event: str, text: str, severity: str = "warning", incident: str = INCIDENT
) -> Notification:
    return Notification(
        incident_id=incident, cluster="sandbox", node="gpu-01", fault="XID_79",
        event=event, text=text, severity=severity,
    )  # fmt: skip


OPENED = note("opened", "XID_79 on gpu-01: plan reboot (mode approve)")
HELD = note("held", "quarantine of gpu-01 held: breaker tripped")
APPROVAL = note("approval_needed", "reboot of gpu-01 needs approval by one of ['alice']")
ESCALATED = note("escalated", "health gate failed after reboot (gpu0: missing); next: replace")
RESOLVED = note("resolved", "resolved; gpu-01 back in service", "info")


@dataclass
class Decisions:
    """The injected `decide`: records each call, raises `error` when one is set."""

    calls: list[dict[str, Any]] = field(default_factory=list)
    error: Exception | None = None

    async def __call__(
        self, *, incident_id: str, step: str, approver: str, approve: bool, comment: str,
        via: str,
    ) -> None:  # fmt: skip
        self.calls.append(
            {"incident_id": incident_id, "step": step, "approver": approver, "approve": approve,
             "via": via}
        )  # fmt: skip
        if self.error is not None:
            raise self.error


@dataclass
class Slack:
    url: str  # the emulator's root
    admin: httpx.AsyncClient

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/"

    async def channel(self) -> dict[str, Any]:
        return (await self.admin.get(f"/_emulator/channels/{CHANNEL}")).raise_for_status().json()

    async def requests(self, method: str) -> list[dict[str, Any]]:
        calls = (await self.admin.get("/_emulator/requests")).json()
        return [c for c in calls if c["method"] == method]

    async def fault(self, **fault: Any) -> None:
        (await self.admin.post("/_emulator/faults", json=fault)).raise_for_status()

    async def click(self, action: str, user: str, **extra: Any) -> dict[str, Any]:
        body = {"incident_id": INCIDENT, "action": action, "user": user, **extra}
        resp = await self.admin.post("/_emulator/click", json=body)
        return resp.raise_for_status().json()


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    config = EmulatorConfig(
        token=TOKEN,
        signing_secret=SECRET,
        users={"U_ALICE": "alice", "U_BOB": "bob", "U_MALLORY": "mallory"},
        usergroups={APPROVERS_GROUP: ["U_BOB"]},
    )
    with EmulatorServer(create_app(config)) as server:
        yield server


@pytest_asyncio.fixture
async def slack(emulator: EmulatorServer) -> AsyncIterator[Slack]:
    async with httpx.AsyncClient(base_url=emulator.url, timeout=30, trust_env=False) as admin:
        yield Slack(url=emulator.url, admin=admin)


def notifier_for(
    slack: Slack,
    store: Any = None,
    *,
    api_url: str | None = None,
    request_timeout_s: int = 1,
    **kw: Any,
) -> SlackNotifier:
    client = slack_web_client(
        token=TOKEN, base_url=api_url or slack.api_url, timeout_s=request_timeout_s
    )
    return SlackNotifier(
        client=client,
        channel=CHANNEL,
        store=store,
        links=Links(temporal_ui_url=UI, api_url=API),
        page_group_id=PAGERS,
        **{"send_timeout_s": 5.0, **kw},
    )


@pytest.fixture
def store(tmp_path: Path) -> FileThreadStore:
    return FileThreadStore(tmp_path / "slack-threads")


def actions_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for b in message["blocks"] if b["type"] == "actions"]


def flat(message: dict[str, Any]) -> str:
    return json.dumps(message["blocks"])


# --- the incident message and its thread --------------------------------------------------


async def test_one_message_updated_in_place_with_a_thread_in_order(
    slack: Slack, store: FileThreadStore
) -> None:
    n = notifier_for(slack, store)
    for i, event in enumerate([OPENED, HELD, APPROVAL, ESCALATED, RESOLVED]):
        await n.send(event)
        (parent,) = (await slack.channel())["messages"]
        assert parent["edits"] == i
    assert [r["text"].split("*")[1] for r in parent["replies"]] == [
        "opened", "held", "approval_needed", "escalated", "resolved",
    ]  # fmt: skip
    assert [float(r["ts"]) for r in parent["replies"]] == sorted(
        float(r["ts"]) for r in parent["replies"]
    )
    blocks = flat(parent)
    assert "gpu-01" in blocks and "sandbox" in blocks and "XID_79" in blocks
    assert "*Action*\\nreplace" in blocks and "resolved: back in service" in blocks
    assert f"{UI}/namespaces/default/workflows/remediation-sandbox-gpu-01" in blocks
    assert f"{API}/v1/incidents/{INCIDENT}" in blocks
    assert not actions_of(parent)  # the decision is long past: no buttons
    assert parent["metadata"]["event_payload"]["incident_id"] == INCIDENT
    assert store.get(INCIDENT) is not None


async def test_the_alerts_words_reach_the_channel_intact(slack: Slack) -> None:
    """The opening message carries the alert's summary and runbook link (the workflow puts
    them in it): Japanese and emoji arrive as they were written."""
    words = "GPU 3 が応答しません 🔥 — runbook: https://runbooks.example.com/xid-79#対処"
    n = notifier_for(slack)
    await n.send(note("opened", f"XID_79 on gpu-01: plan reboot\n{words}"))
    (parent,) = (await slack.channel())["messages"]
    assert words in parent["text"]
    assert words in parent["replies"][0]["text"]
    # The card keeps showing them as the incident moves on.
    await n.send(HELD)
    (parent,) = (await slack.channel())["messages"]
    assert parent["edits"] == 1
    assert words in json.dumps(parent["blocks"], ensure_ascii=False)


async def test_approval_needed_carries_the_buttons_until_the_next_event(slack: Slack) -> None:
    n = notifier_for(slack)
    await n.send(OPENED)
    await n.send(APPROVAL)
    (parent,) = (await slack.channel())["messages"]
    (actions,) = actions_of(parent)
    ids = [e["action_id"] for e in actions["elements"]]
    assert ids == ["approve", "reject"]
    values = {json.loads(e["value"])["step"] for e in actions["elements"]}
    assert values == {"reboot"}
    assert {json.loads(e["value"])["incident_id"] for e in actions["elements"]} == {INCIDENT}
    await n.send(ESCALATED)
    (parent,) = (await slack.channel())["messages"]
    assert not actions_of(parent)


async def test_critical_mentions_the_paging_group_and_is_broadcast(slack: Slack) -> None:
    n = notifier_for(slack)
    await n.send(OPENED)
    await n.send(note("failed", "health gate failed after replace; left drained", "critical"))
    (parent,) = (await slack.channel())["messages"]
    opened, failed = parent["replies"]
    assert f"<!subteam^{PAGERS}>" in failed["text"] and failed["reply_broadcast"]
    assert "subteam" not in opened["text"] and not opened["reply_broadcast"]
    assert f"<!subteam^{PAGERS}>" in parent["text"] + flat(parent)


async def test_the_thread_survives_restarts_and_workers_without_the_store(
    slack: Slack, store: FileThreadStore
) -> None:
    await notifier_for(slack, store).send(OPENED)
    await notifier_for(slack, store).send(HELD)  # a restarted worker, same store
    await notifier_for(slack, MemoryThreadStore()).send(RESOLVED)  # another host
    (parent,) = (await slack.channel())["messages"]
    assert [r["text"].split("*")[1] for r in parent["replies"]] == ["opened", "held", "resolved"]
    assert parent["edits"] == 2


async def test_a_retried_event_is_told_once_and_a_deleted_message_is_posted_anew(
    slack: Slack, store: FileThreadStore
) -> None:
    n = notifier_for(slack, store)
    await n.send(OPENED)
    await n.send(OPENED)
    (parent,) = (await slack.channel())["messages"]
    assert len(parent["replies"]) == 1
    card = IncidentCard.for_note(HELD)
    store.put(ThreadRecord(incident_id=INCIDENT, channel=CHANNEL, ts="1.000001", card=card))
    await notifier_for(slack, store, history_lookup=False).send(HELD)
    first, second = (await slack.channel())["messages"]
    assert second["replies"][0]["text"].startswith(":hourglass: *held*")
    assert store.get(INCIDENT).ts == second["ts"]  # type: ignore[union-attr]


async def test_429_is_retried_after_retry_after(slack: Slack) -> None:
    await slack.fault(method="chat.postMessage", count=1, status=429, retry_after=1)
    started = time.monotonic()
    await notifier_for(slack).send(OPENED)
    assert time.monotonic() - started >= 1
    posts = await slack.requests("chat.postMessage")
    assert [p["status"] for p in posts] == [429, 200, 200]
    (parent,) = (await slack.channel())["messages"]
    assert len(parent["replies"]) == 1


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "outage",
    [
        {"error": "invalid_auth"},
        {"status": 503},
        {"status": 500},
        {"status": 429, "retry_after": 60},
        {"delay_s": 3},
        "unreachable",
    ],
    ids=["invalid_auth", "503", "500", "429-long", "hung", "unreachable"],
)
async def test_a_slack_outage_never_raises_nor_blocks(slack: Slack, outage: Any) -> None:
    bound = 1.0  # the send's bound; a hung Slack answers after 3 s, a call's timeout is 10 s
    api_url = None
    if outage == "unreachable":
        api_url = f"http://127.0.0.1:{closed_port()}/api/"
    else:
        await slack.fault(count=None, **outage)
    # Each call may take longer than the bound: the bound is on the whole send.
    n = notifier_for(slack, api_url=api_url, send_timeout_s=bound, request_timeout_s=10)
    started = time.monotonic()
    await n.send(OPENED)  # must not raise
    assert time.monotonic() - started < bound + 1.5
    await slack.admin.delete("/_emulator/faults")
    await notifier_for(slack).send(HELD)  # Slack is back: the next event catches up
    (parent,) = (await slack.channel())["messages"]
    assert "held by the fleet guard" in flat(parent)


async def test_an_unknown_channel_is_logged_not_raised(slack: Slack) -> None:
    client = slack_web_client(token=TOKEN, base_url=slack.api_url, timeout_s=1)
    await SlackNotifier(client=client, channel="C_NOPE").send(OPENED)
    assert (await slack.requests("chat.postMessage"))[0]["error"] == "channel_not_found"


# --- interactivity ------------------------------------------------------------------------


@dataclass
class Interactions:
    url: str
    decisions: Decisions
    seen: list[tuple[bytes, dict[str, str]]]


@pytest_asyncio.fixture
async def interactions(slack: Slack) -> AsyncIterator[Interactions]:
    """The route the API will mount, in its own uvicorn; clicks are sent to it."""
    decisions = Decisions()
    client = slack_web_client(token=TOKEN, base_url=slack.api_url, timeout_s=2)
    handler = InteractionHandler(
        signing_secret=SECRET,
        client=client,
        decide=decisions,
        approvers=ApproverDirectory(
            users={"U_ALICE": "alice"}, group_id=APPROVERS_GROUP, client=client
        ),
    )
    seen: list[tuple[bytes, dict[str, str]]] = []
    app = FastAPI()

    @app.post("/slack/interactions")
    async def route(request: Request) -> Response:
        body = await request.body()
        seen.append((body, dict(request.headers)))
        r = await handler.handle(body, request.headers)
        return JSONResponse(r.body, status_code=r.status_code)

    with EmulatorServer(app) as server:
        url = f"{server.url}/slack/interactions"
        await slack.admin.put("/_emulator/config", json={"interactivity_url": url})
        await notifier_for(slack).send(OPENED)
        await notifier_for(slack).send(APPROVAL)
        yield Interactions(url=url, decisions=decisions, seen=seen)


async def test_a_signed_click_decides_and_replaces_the_buttons(
    slack: Slack, interactions: Interactions
) -> None:
    answer = await slack.click("approve", "U_ALICE")
    assert answer["status"] == 200 and answer["body"]["outcome"] == "approved"
    assert interactions.decisions.calls == [
        {
            "incident_id": INCIDENT,
            "step": "reboot",
            "approver": "alice",
            "approve": True,
            "via": "slack:U_ALICE",
        }
    ]
    (parent,) = (await slack.channel())["messages"]
    assert not actions_of(parent)
    assert "Approved by <@U_ALICE> (alice) at " in flat(parent)
    assert parent["replies"][-1]["text"].startswith(":white_check_mark: Approved by <@U_ALICE>")


async def test_the_same_click_delivered_twice_decides_once(
    slack: Slack, interactions: Interactions
) -> None:
    """A click re-sent byte for byte (a retry, or an attacker replaying a captured request
    within the signature window) is answered, and decides nothing the second time."""
    first = await slack.click("approve", "U_ALICE")
    assert first["body"]["outcome"] == "approved"
    body, headers = interactions.seen[-1]
    keep = {k: v for k, v in headers.items() if k.lower().startswith(("x-slack", "content-type"))}
    async with httpx.AsyncClient(trust_env=False) as http:
        again = await http.post(interactions.url, content=body, headers=keep)
    assert again.status_code == 200 and again.json()["outcome"] == "duplicate"
    assert len(interactions.decisions.calls) == 1


async def test_a_group_member_rejects_as_their_username(
    slack: Slack, interactions: Interactions
) -> None:
    answer = await slack.click("reject", "U_BOB")
    assert answer["body"]["outcome"] == "rejected"
    assert interactions.decisions.calls[0]["approver"] == "bob"
    assert interactions.decisions.calls[0]["approve"] is False
    (parent,) = (await slack.channel())["messages"]
    assert "Rejected by <@U_BOB> (bob)" in flat(parent)


def signed(body: bytes, *, secret: str = SECRET, age_s: int = 0) -> dict[str, str]:
    ts = str(int(time.time()) - age_s)
    sig = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body) or ""
    return {
        "Content-Type": "application/x-www-form-urlencoded",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": sig,
    }


@pytest.mark.parametrize(
    "headers",
    [
        lambda b: signed(b, secret="forged"),
        # A minute past the five-minute window either way: a busy machine's second
        # between signing and checking never brings them back into it.
        lambda b: signed(b, age_s=360),
        lambda b: signed(b, age_s=-360),
        lambda b: {**signed(b), "X-Slack-Request-Timestamp": "soon"},
        lambda b: {"Content-Type": "application/x-www-form-urlencoded"},
    ],
    ids=["forged", "stale", "future", "bad-timestamp", "unsigned"],
)
async def test_an_unauthentic_click_is_401_and_decides_nothing(
    slack: Slack, interactions: Interactions, headers: Any
) -> None:
    await slack.click("approve", "U_ALICE", timestamp_offset_s=-400)
    real_body = interactions.seen[-1][0]
    async with httpx.AsyncClient(trust_env=False) as http:
        resp = await http.post(interactions.url, content=real_body, headers=headers(real_body))
    assert resp.status_code == 401
    assert interactions.decisions.calls == []
    (parent,) = (await slack.channel())["messages"]
    assert actions_of(parent)  # still waiting


async def test_a_stale_click_from_the_emulator_is_refused_too(
    slack: Slack, interactions: Interactions
) -> None:
    answer = await slack.click("approve", "U_ALICE", timestamp_offset_s=400)
    assert answer["status"] == 401 and interactions.decisions.calls == []


async def test_a_user_not_allowed_gets_an_ephemeral_refusal(
    slack: Slack, interactions: Interactions
) -> None:
    answer = await slack.click("approve", "U_MALLORY")
    assert answer["body"]["outcome"] == "not_allowed"
    assert interactions.decisions.calls == []
    view = await slack.channel()
    (eph,) = view["ephemeral"]
    assert eph["user"] == "U_MALLORY" and "not allowed" in eph["text"]
    assert actions_of(view["messages"][0])


@pytest.mark.parametrize(
    "error",
    [
        DecisionRefused(f"incident {INCIDENT} is closed (resolved)"),
        IncidentNotFound(f"no incident {INCIDENT} in cluster sandbox"),
    ],
    ids=["closed", "not-found"],
)
async def test_a_refused_decision_is_answered_ephemerally(
    slack: Slack, interactions: Interactions, error: Exception
) -> None:
    interactions.decisions.error = error
    answer = await slack.click("approve", "U_ALICE")
    assert answer["status"] == 200 and answer["body"]["outcome"] == "refused"
    (eph,) = (await slack.channel())["ephemeral"]
    assert eph["user"] == "U_ALICE" and str(error) in eph["text"]


async def test_the_emulator_click_is_a_signed_block_actions_payload(
    slack: Slack, interactions: Interactions
) -> None:
    answer = await slack.click("approve", "U_ALICE")
    body, headers = interactions.seen[-1]
    assert SignatureVerifier(SECRET).is_valid_request(body, headers)
    payload = json.loads(parse_qs(body.decode())["payload"][0])
    (parent,) = (await slack.channel())["messages"]
    assert payload["type"] == "block_actions"
    assert payload["user"]["id"] == "U_ALICE"
    assert payload["channel"]["id"] == CHANNEL == payload["container"]["channel_id"]
    assert payload["container"]["message_ts"] == parent["ts"] == answer["message_ts"]
    assert payload["response_url"].startswith(slack.url)
    (action,) = payload["actions"]
    assert action["action_id"] == "approve"
    assert json.loads(action["value"]) == {"incident_id": INCIDENT, "step": "reboot"}


async def test_other_interactions_are_acknowledged_and_ignored(
    slack: Slack, interactions: Interactions
) -> None:
    body = urlencode({"payload": json.dumps({"type": "view_closed"})}).encode()
    async with httpx.AsyncClient(trust_env=False) as http:
        resp = await http.post(interactions.url, content=body, headers=signed(body))
        bad = await http.post(interactions.url, content=b"x=1", headers=signed(b"x=1"))
    assert resp.status_code == 200 and resp.json()["outcome"] == "ignored"
    assert bad.status_code == 400
    assert interactions.decisions.calls == []


class AckRecorder:
    def __init__(self) -> None:
        self.acks: list[str] = []

    async def send_socket_mode_response(self, response: Any) -> None:
        self.acks.append(response.envelope_id)


async def test_socket_mode_acks_and_feeds_the_same_handler(slack: Slack) -> None:
    await notifier_for(slack).send(APPROVAL)
    decisions = Decisions()
    client = slack_web_client(token=TOKEN, base_url=slack.api_url, timeout_s=2)
    handler = InteractionHandler(
        signing_secret=SECRET,
        client=client,
        decide=decisions,
        approvers=ApproverDirectory(users={"U_ALICE": "alice"}),
    )
    runner = SocketModeRunner(app_token="xapp-test", web_client=client, handler=handler)
    parent = (await slack.channel())["messages"][0]
    payload = {
        "type": "block_actions",
        "user": {"id": "U_ALICE", "username": "alice"},
        "container": {"type": "message", "message_ts": parent["ts"], "channel_id": CHANNEL},
        "message": {"ts": parent["ts"], "blocks": parent["blocks"]},
        "actions": [actions_of(parent)[0]["elements"][0]],
    }
    ack = AckRecorder()
    await runner.on_request(
        ack, SocketModeRequest(type="interactive", envelope_id="env-1", payload=payload)
    )
    assert ack.acks == ["env-1"]
    assert decisions.calls == [
        {
            "incident_id": INCIDENT,
            "step": "reboot",
            "approver": "alice",
            "approve": True,
            "via": "slack:U_ALICE",
        }
    ]


# --- the `sandbox slack` CLI --------------------------------------------------------------


async def test_cli_click_and_log(slack: Slack, interactions: Interactions) -> None:
    runner = CliRunner()
    args = ["--slack-url", slack.api_url]
    clicked = await asyncio.to_thread(
        runner.invoke,
        slack_app,
        ["click", "--incident", INCIDENT, "--action", "approve", "--as", "U_ALICE", *args],
    )
    assert clicked.exit_code == 0, clicked.output
    assert "approved" in clicked.output
    refused = await asyncio.to_thread(
        runner.invoke,
        slack_app,
        ["click", "--incident", INCIDENT, "--action", "approve", "--as", "U_ALICE", *args],
    )
    assert refused.exit_code == 2  # the buttons are gone: nothing left to click
    log = await asyncio.to_thread(runner.invoke, slack_app, ["log", *args])
    assert log.exit_code == 0, log.output
    replies = [line for line in log.output.splitlines() if line.startswith("  └ ")]
    assert ["*opened*" in replies[0], "*approval_needed*" in replies[1]] == [True, True]
    assert "Approved by <@U_ALICE> (alice)" in replies[2]
    assert "XID_79 on gpu-01" in log.output and "[Approve]" not in log.output


# --- several notifiers --------------------------------------------------------------------


class Hangs:
    async def send(self, note: Notification) -> None:
        await asyncio.Event().wait()


class Fails:
    async def send(self, note: Notification) -> None:
        raise RuntimeError("broken notifier")


async def test_multi_notifier_isolates_and_the_webhook_is_signed() -> None:
    received: list[tuple[bytes, dict[str, str]]] = []
    app = FastAPI()

    @app.post("/hook")
    async def hook(request: Request) -> dict[str, bool]:
        received.append((await request.body(), dict(request.headers)))
        return {"ok": True}

    with EmulatorServer(app) as server:
        async with httpx.AsyncClient(trust_env=False) as http:
            hook_n = WebhookNotifier(client=http, url=f"{server.url}/hook", secret="hook-secret")
            multi = MultiNotifier([Hangs(), Fails(), hook_n], timeout_s=1)
            started = time.monotonic()
            await multi.send(OPENED)
            assert time.monotonic() - started < 3
    (body, headers) = received[0]
    assert json.loads(body)["event"] == "opened"
    ts = headers["x-autoclusters-timestamp"]
    assert headers["x-autoclusters-signature"] == webhook_signature("hook-secret", ts, body)


def test_the_package_surface_is_sorted_and_complete() -> None:
    import autoclusters.integrations.slack as pkg

    assert pkg.__all__ == sorted(pkg.__all__)
    assert all(hasattr(pkg, name) for name in pkg.__all__)
