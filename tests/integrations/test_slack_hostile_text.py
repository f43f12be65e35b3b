"""Hostile text on its way to Slack arrives as words: through the real notifier and the real
interactivity handler (slack-sdk over loopback) into the Slack emulator, and from an alert's
annotations through the real remediation workflow (time-skipping server, fake cluster).

The corpus: mentions (`<!channel>`, `<!here>`, `<!everyone>`, `<@U123>`, `<#C123>`,
`<!subteam^S1>`, bare `@channel`), links (`<https://evil.example|Approve>`,
`<javascript:alert(1)|x>`), pre-escaped `&lt;`, control characters, right-to-left marks,
mrkdwn emphasis, and 100 kB of text. What arrives is checked as Slack would read it:

- no `<…>` in any mrkdwn text but our own (the paging group, the clicker's id, the links
  to the workflow, the incident and an https runbook); every `&` starts an entity; no
  control character, bidi mark or bare mass mention survives;
- the hostile words are there, escaped (the reader sees them as written);
- every text within Slack's limits (section 3,000, field 2,000, header 150, message text
  4,000 of Slack's 40,000), mrkdwn objects `verbatim` so Slack links nothing by itself;
- the real Approve / Reject buttons are still there, carrying the incident and its step,
  and a click on them still decides; its answers (decided line, ephemeral refusal) escape
  the approver's name and the refusal's reason.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from temporalio.testing import WorkflowEnvironment

from autoclusters.core.fault_evidence import FaultEvidence
from autoclusters.core.models import FaultReport, Notification
from autoclusters.integrations.slack import ApproverDirectory, InteractionHandler, slack_web_client
from autoclusters.integrations.slack.cards import parse_approval_value
from autoclusters.sandbox.crusoe.emulator import EmulatorServer
from autoclusters.sandbox.slack.emulator import EmulatorConfig, create_app
from autoclusters.workflows.remediation import NodeRemediation
from tests.integrations.test_slack import API, PAGERS, SECRET, TOKEN, UI, Slack, notifier_for
from tests.workflows.test_remediation_workflow import _fleet, _policy, _until, _waiting

INCIDENT = "inc-20260501-100000-hostile"
MENTIONS = [
    "<!channel>", "<!here>", "<!everyone>", "<@U123>", "<#C123>", "<!subteam^S1>",
    "<!channel|channel>", "<!date^1392734382^{date}|x>",
]  # fmt: skip
LINKS = ["<https://evil.example|Approve>", "<javascript:alert(1)|x>", "<http://evil.example>"]
RTL = "\u202egnp.exe\u202c \u2066txt\u2069 \u200e\u200f\u061c"
CONTROL = "bell\x07 esc\x1b[31m nul\x00 del\x7f c1\x85 cr\r"
HOSTILE = " ".join(
    [*MENTIONS, *LINKS, "&lt;!channel&gt;", "@channel @here @everyone", "*bold* _it_ ~s~ `c`",
     RTL, CONTROL]
)  # fmt: skip
LONG = "A" * 100_000
GOOD_RUNBOOK = "https://runbooks.example.com/xid-79?a=1&b=2#対処"

# The only markup of our own that may appear: the paging group, a clicker's id, the links
# AutoClusters makes (the sandbox's Temporal UI and API are http: our configuration).
OURS = re.compile(
    rf"<!subteam\^{PAGERS}>|<@U_[A-Z]+>"
    rf"|<{re.escape(UI)}/[^|<>]+\|Temporal workflow>|<{re.escape(API)}/[^|<>]+\|API>"
    r"|<https://runbooks\.example\.com/[^|<>\s]+\|runbook>"
)
# Block Kit's limits by where the text sits; anything else is message text (ours: 4,000).
LIMITS = {
    "section": 3000,
    "field": 2000,
    "context": 3000,
    "header": 150,
    "button": 75,
    "confirm": 300,
}
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def hostile_note(event: str, text: str, severity: str = "critical") -> Notification:
    return Notification(
        incident_id=INCIDENT,
        cluster=f"prod {HOSTILE[:200]}",
        node="gpu-01`<!here>`\u202e10-upg",
        fault="XID_79 <!channel>",
        event=event,
        text=text,
        severity=severity,
        runbook_url=GOOD_RUNBOOK,
    )


def texts(message: dict[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, type, text) of every text Slack renders in `message` and its replies."""
    yield "message", "mrkdwn", message["text"]
    for reply in message.get("replies", []):
        yield "message", "mrkdwn", reply["text"]
    for block in message.get("blocks", []):
        kind = block["type"]
        if kind == "header":
            yield "header", block["text"]["type"], block["text"]["text"]
        if kind == "section" and "text" in block:
            yield "section", block["text"]["type"], block["text"]["text"]
        for f in block.get("fields", []):
            yield "field", f["type"], f["text"]
        if kind == "context":
            for e in block["elements"]:
                yield "context", e["type"], e["text"]
        for e in block.get("elements", []) if kind == "actions" else []:
            yield "button", "plain_text", e["text"]["text"]
            yield "confirm", e["confirm"]["text"]["type"], e["confirm"]["text"]["text"]


def mrkdwn_objects(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Every mrkdwn text object in the message's blocks (for `verbatim`)."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "mrkdwn":
                found.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(message.get("blocks", []))
    return found


def assert_words_only(message: dict[str, Any]) -> None:
    """What `message` shows parses nothing of the outside text, within Slack's limits."""
    for where, kind, text in texts(message):
        assert text, f"empty {where} text"
        assert not CONTROLS.search(text), (where, text[:200])
        assert not BIDI.search(text), (where, text[:200])
        assert len(text) <= LIMITS.get(where, 4000), (where, len(text))
        if kind != "mrkdwn":
            continue  # plain_text: Slack parses no mention, link or entity in it
        assert not re.search(r"&(?!amp;|lt;|gt;)", text), (where, text[:200])
        assert not re.search(r"@(here|channel|everyone)\b", text, re.I), (where, text[:200])
        for token in re.findall(r"<[^>]*>?", text):
            assert OURS.fullmatch(token), f"{where}: outside markup {token!r} in {text[:300]!r}"
    for obj in mrkdwn_objects(message):
        assert obj.get("verbatim") is True, obj


def buttons(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]]


@pytest.fixture
def emulator() -> Iterator[EmulatorServer]:
    """The emulator of tests/integrations/test_slack.py, with a user whose name is hostile."""
    config = EmulatorConfig(
        token=TOKEN,
        signing_secret=SECRET,
        users={"U_EVIL": f"<!here> {RTL} evil", "U_ALICE": "alice"},
        usergroups={"S0APPROVERS": ["U_EVIL"]},
    )
    with EmulatorServer(create_app(config)) as server:
        yield server


@pytest_asyncio.fixture
async def slack(emulator: EmulatorServer) -> AsyncIterator[Slack]:
    async with httpx.AsyncClient(base_url=emulator.url, timeout=30, trust_env=False) as admin:
        yield Slack(url=emulator.url, admin=admin)


# --- the notifier ---------------------------------------------------------------------------


async def test_the_hostile_corpus_arrives_as_words_with_the_buttons_intact(slack: Slack) -> None:
    n = notifier_for(slack)
    opened = hostile_note("opened", f"XID_79 on gpu-01: plan reboot\n{HOSTILE} {LONG}")
    await n.send(opened)
    asked = f"reboot of gpu-01 needs approval by one of ['alice', '<!channel>']: {HOSTILE}"
    await n.send(hostile_note("approval_needed", asked))
    (parent,) = (await slack.channel())["messages"]
    assert_words_only(parent)
    blocks = json.dumps(parent["blocks"], ensure_ascii=False)
    # The words are there, escaped: the reader sees them as they were written.
    for word in ["&lt;!channel&gt;", "&lt;https://evil.example|Approve&gt;", "&amp;lt;!channel"]:
        assert word in blocks, word
    assert "&lt;javascript:alert(1)|x&gt;" in blocks and "*bold* _it_" in blocks
    assert "＠channel ＠here ＠everyone" in blocks and "gnp.exe" in blocks
    assert "`gpu-01ˋ&lt;!here&gt;ˋ10-upg`" in blocks  # the node stays inside its code span
    # Our own markup still works: the page, our links, the alert's https runbook.
    assert parent["text"].startswith(f"<!subteam^{PAGERS}> ")
    assert "<https://runbooks.example.com/xid-79?a=1&amp;b=2#対処|runbook>" in blocks
    assert f"{UI}/namespaces/default/workflows/" in blocks and f"{API}/v1/incidents/" in blocks
    # 100 kB of summary: cut, not refused; the card and the thread carry its start.
    (summary,) = [b for b in parent["blocks"] if "AAAA" in b.get("text", {}).get("text", "")]
    assert summary["type"] == "section" and summary["text"]["text"].endswith("A…")
    assert parent["replies"][0]["text"].endswith("A…")
    # The real buttons: Approve / Reject for this incident's step.
    got = buttons(parent)
    assert [b["action_id"] for b in got] == ["approve", "reject"]
    assert {parse_approval_value(b["value"]) for b in got} == {(INCIDENT, "reboot")}
    assert [b["text"]["text"] for b in got] == ["Approve", "Reject"]


async def test_an_outside_runbook_link_is_https_or_text(slack: Slack) -> None:
    n = notifier_for(slack)
    for i, url in enumerate(
        ["javascript:alert(1)", "http://runbooks.example.com/x", "https://x.example|Approve"]
    ):
        note = hostile_note("opened", f"opened {i}\nsummary — runbook: {url}", "info")
        await n.send(note.model_copy(update={"incident_id": f"inc-{i}", "runbook_url": url}))
    messages = (await slack.channel())["messages"]
    assert len(messages) == 3
    for m in messages:
        assert_words_only(m)
        assert "|runbook>" not in json.dumps(m["blocks"])  # shown as words, never linked


# --- the buttons' answers -------------------------------------------------------------------


class Refusing:
    """The injected `decide`: refuses with a hostile reason, or accepts."""

    def __init__(self) -> None:
        self.refuse: str | None = None
        self.calls = 0

    async def __call__(self, **decision: Any) -> None:
        self.calls += 1
        if self.refuse is not None:
            raise PermissionError(self.refuse)


@pytest_asyncio.fixture
async def decide(slack: Slack) -> AsyncIterator[Refusing]:
    """The handler the API mounts, in its own uvicorn; the emulator's clicks go to it."""
    decisions = Refusing()
    client = slack_web_client(token=TOKEN, base_url=slack.api_url, timeout_s=2)
    handler = InteractionHandler(
        signing_secret=SECRET,
        client=client,
        decide=decisions,
        approvers=ApproverDirectory(group_id="S0APPROVERS", client=client),
    )
    app = FastAPI()

    @app.post("/slack/interactions")
    async def route(request: Request) -> Response:
        r = await handler.handle(await request.body(), request.headers)
        return JSONResponse(r.body, status_code=r.status_code)

    with EmulatorServer(app) as server:
        url = f"{server.url}/slack/interactions"
        await slack.admin.put("/_emulator/config", json={"interactivity_url": url})
        n = notifier_for(slack)
        await n.send(hostile_note("opened", f"opened\n{HOSTILE}"))
        await n.send(hostile_note("approval_needed", "reboot of gpu-01 needs approval"))
        yield decisions


async def click(slack: Slack, user: str) -> dict[str, Any]:
    body = {"incident_id": INCIDENT, "action": "approve", "user": user}
    return (await slack.admin.post("/_emulator/click", json=body)).raise_for_status().json()


async def test_a_refusal_with_a_hostile_reason_is_told_as_words(
    slack: Slack, decide: Refusing
) -> None:
    decide.refuse = f"<!channel> is not waiting: <https://evil.example|Approve> {CONTROL}"
    answer = await click(slack, "U_EVIL")
    assert answer["body"]["outcome"] == "refused" and decide.calls == 1
    (eph,) = (await slack.channel())["ephemeral"]
    assert eph["user"] == "U_EVIL"
    assert_words_only({"text": eph["text"]})
    assert "&lt;!channel&gt; is not waiting: &lt;https://evil.example|Approve&gt;" in eph["text"]


async def test_a_decision_by_a_hostile_username_is_marked_as_words(
    slack: Slack, decide: Refusing
) -> None:
    answer = await click(slack, "U_EVIL")
    assert answer["body"]["outcome"] == "approved", answer
    (parent,) = (await slack.channel())["messages"]
    assert not buttons(parent)  # decided: the buttons are gone
    assert_words_only(parent)
    decided = parent["replies"][-1]["text"]
    assert decided.startswith(":white_check_mark: Approved by <@U_EVIL> (&lt;!here&gt; ")
    assert "evil) at " in decided


# --- from an alert, through the workflow ----------------------------------------------------


async def test_a_hostile_alert_reaches_the_thread_as_words(
    env: WorkflowEnvironment, slack: Slack
) -> None:
    """The alert's annotations and labels and the policy's approvers, as the real workflow
    words its notifications, told through the notifier: nothing of them parses."""
    async with _fleet(env) as f:
        req = f.request(policy=_policy(mode="approve", approvers=["alice", "<!channel>"]))
        evidence = FaultEvidence.from_alert(
            key="am:fp:hostile",
            starts_at=datetime(2026, 1, 5, 2, 58, tzinfo=UTC),
            labels={"alertname": "<!here>", "Hostname": "gpu-01", "exported_pod": HOSTILE},
            annotations={
                "summary": f"{HOSTILE} {LONG}",
                "description": HOSTILE,
                "runbook_url": GOOD_RUNBOOK,
            },
        )
        await env.client.execute_update_with_start_workflow(
            NodeRemediation.report_fault,
            FaultReport(
                incident_id=req.incident_id,
                fault=req.fault,
                source="alertmanager",
                at=evidence.starts_at or req.opened_at,
                evidence=evidence,
            ),
            start_workflow_operation=f.with_start(req),
        )
        handle = env.client.get_workflow_handle(f.started[-1])

        def asked(st: Any) -> bool:
            sent = st.step("notify_approval_needed")
            return bool(_waiting("approval")(st) and sent and sent.finished_at)

        await _until(handle, asked, "the approval_needed notification")
        await handle.terminate("test done")
    notes = [n for n in f.notes() if n.event in ("opened", "approval_needed")]
    assert [n.event for n in notes] == ["opened", "approval_needed"]
    assert all(n.runbook_url == GOOD_RUNBOOK for n in notes)
    n = notifier_for(slack)
    for note in notes:
        await n.send(note)
    (parent,) = (await slack.channel())["messages"]
    assert_words_only(parent)
    blocks = json.dumps(parent["blocks"], ensure_ascii=False)
    assert "&lt;!channel&gt;" in blocks and "&lt;https://evil.example|Approve&gt;" in blocks
    assert "|runbook>" in blocks  # the field meant to be a link is one
    assert [b["action_id"] for b in buttons(parent)] == ["approve", "reject"]
    assert {parse_approval_value(b["value"])[0] for b in buttons(parent)} == {req.incident_id}
