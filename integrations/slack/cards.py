"""The incident card: the one Slack message an incident keeps, and its thread replies.

A `Notification` carries an event and a sentence. The card remembers what earlier events
said (the planned repair, the step waiting for approval) so every update of the message
shows the whole picture, not just the latest sentence. Rendering is pure: the same card
always gives the same message, so an update repeated after a retry changes nothing.

Approve / Reject buttons are on the card only while the incident waits for a decision;
the next event's update takes them away, so an old button can never decide a later step.

GPU sharing's moves use the same card (fault `gpu-rebalance`, the move id in place
of the incident id): a move waiting for approval carries the buttons with the step `move`,
which no incident has, so the API sends such a click to the sharing workflow, never to an
incident.

Everything on the card but our own labels came from outside (the alert's words, node and
fault names, the workflow's sentences quoting Slurm and the policy): it reaches Slack only
through `escape` (`markup`, `code`, `plain_object`), and the only outside link is the
alert's https runbook URL.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from autoclusters.core.models import RETURNED_JOBS_STEP, Notification, workflow_id
from autoclusters.core.sharing import MOVE_APPROVAL_STEP, SHARING_FAULT, sharing_workflow_id
from autoclusters.integrations.slack.escape import (
    MAX_BUTTON,
    MAX_CONFIRM_BUTTON,
    MAX_CONFIRM_TEXT,
    MAX_CONFIRM_TITLE,
    MAX_FIELD,
    MAX_HEADER,
    WEB,
    Mrkdwn,
    code,
    escape,
    group_mention,
    join,
    link,
    markup,
    plain_object,
    text_object,
)

__all__ = [
    "APPROVAL_BLOCK_PREFIX",
    "METADATA_EVENT_TYPE",
    "IncidentCard",
    "Links",
    "approval_value",
    "card_message",
    "card_metadata",
    "decided_blocks",
    "event_text",
    "parse_approval_value",
]

METADATA_EVENT_TYPE = "autoclusters_incident"
APPROVAL_BLOCK_PREFIX = "approval"
APPROVAL_EVENTS = frozenset({"approval_needed", "approval_reminder"})
TERMINAL_EVENTS = frozenset(
    {"resolved", "failed", "rejected", "observed", "monitored", "cancelled", "handed_off"}
)

STATE_WORDS = {
    "opened": "open",
    "held": "held by the fleet guard",
    "approval_needed": "waiting for approval",
    "approval_reminder": "waiting for approval",
    "escalated": "escalated",
    "spare_in_service": "hot spare in service",
    "recovery_chosen": "jobs recovering",
    "resolved": "resolved: back in service",
    "failed": "failed: left drained, a human is paged",
    "rejected": "rejected: left drained",
    "observed": "observed: nothing changed",
    "monitored": "monitored: stays in service",
    "cancelled": "cancelled by a human",
    "handoff_sent": "handed off to the provider",
    "handoff_reminder": "waiting for the provider",
    "handoff_answered": "the provider answered",
    "handed_off": "declined by the provider: left drained",
    "move_done": "moved",
    "move_stopped": "not moved",
    "move_failed": "move failed",
}
EVENT_MARKS = {
    "opened": ":rotating_light:",
    "held": ":hourglass:",
    "approval_needed": ":raising_hand:",
    "approval_reminder": ":raising_hand:",
    "escalated": ":arrow_double_up:",
    "spare_in_service": ":twisted_rightwards_arrows:",
    "recovery_chosen": ":repeat:",
    "resolved": ":white_check_mark:",
    "failed": ":x:",
    "rejected": ":no_entry:",
    "observed": ":eyes:",
    "monitored": ":eyes:",
    "cancelled": ":octagonal_sign:",
    "handoff_sent": ":outbox_tray:",
    "handoff_reminder": ":hourglass:",
    "handoff_answered": ":inbox_tray:",
    "handed_off": ":no_entry:",
    "move_done": ":white_check_mark:",
    "move_stopped": ":no_entry:",
    "move_failed": ":x:",
}

# What the workflow's sentences carry (workflows/remediation.py); the fields belong in
# the Notification itself, these patterns only bridge until they are there.
_PLAN = re.compile(r"\bplan (\w+)")
_NEXT = re.compile(r"\bnext: (\w+)")
_APPROVAL_STEP = re.compile(r"^(?:still waiting: )?(\w+) of \S+ needs approval")


class IncidentCard(BaseModel):
    """What the incident's message shows, folded from the notifications seen so far."""

    incident_id: str
    cluster: str
    node: str
    fault: str
    rung: str | None = None
    event: str = "opened"
    waiting_step: str | None = None  # set while Approve / Reject are offered
    # The alert's summary and runbook link: the lines after the first of the opening
    # message (the workflow puts them there); kept on the card for the incident's life.
    headline: str = ""
    runbook_url: str = ""  # the alert's runbook link: the one outside link the card shows
    severity: str = "info"
    text: str = ""
    updated_at: datetime

    @classmethod
    def for_note(cls, note: Notification) -> IncidentCard:
        return cls(
            incident_id=note.incident_id,
            cluster=note.cluster,
            node=note.node,
            fault=note.fault,
            updated_at=datetime.now(UTC),
        )

    def apply(self, note: Notification) -> IncidentCard:
        """The card after `note`: a new card, this one is left as it was."""
        rung = self.rung
        if m := (_PLAN.search(note.text) or _NEXT.search(note.text)):
            rung = m.group(1)
        waiting = None
        if note.event in APPROVAL_EVENTS and self.is_move:
            waiting = MOVE_APPROVAL_STEP
        elif note.event in APPROVAL_EVENTS:
            m = _APPROVAL_STEP.match(note.text)
            waiting = m.group(1) if m else (self.waiting_step or rung)
            if waiting != RETURNED_JOBS_STEP:  # a decision about jobs, not a repair
                rung = waiting or rung
        headline = self.headline
        if note.event == "opened" and "\n" in note.text:
            headline = note.text.split("\n", 1)[1].strip()
        return self.model_copy(
            update={
                "headline": headline,
                "runbook_url": note.runbook_url or self.runbook_url,
                "rung": rung,
                "event": note.event,
                "waiting_step": waiting,
                "severity": note.severity,
                "text": note.text,
                "updated_at": datetime.now(UTC),
            }
        )

    @property
    def state(self) -> str:
        return STATE_WORDS.get(self.event, self.event.replace("_", " "))

    @property
    def is_move(self) -> bool:
        """The card of GPU sharing's move (its id in `incident_id`), not an incident."""
        return self.fault == SHARING_FAULT

    @property
    def subject(self) -> str:
        """What the message is about, in the operator's words: the fault, or GPU sharing for
        a move (whose `fault` keeps the feature's old code: core/sharing.py says why)."""
        return "GPU sharing" if self.is_move else self.fault


class Links(BaseModel):
    """Where a reader goes next: the workflow in the Temporal UI, the incident in the API."""

    temporal_ui_url: str | None = None
    temporal_namespace: str = "default"
    api_url: str | None = None

    def workflow(self, card: IncidentCard) -> str | None:
        if not self.temporal_ui_url:
            return None
        wid = sharing_workflow_id(card.cluster) if card.is_move else None
        wf = quote(wid or workflow_id(card.cluster, card.node), safe="")
        ns = quote(self.temporal_namespace, safe="")
        return f"{self.temporal_ui_url.rstrip('/')}/namespaces/{ns}/workflows/{wf}"

    def incident(self, card: IncidentCard) -> str | None:
        if not self.api_url or card.is_move:
            return None
        return f"{self.api_url.rstrip('/')}/v1/incidents/{quote(card.incident_id, safe='')}"


def approval_value(incident_id: str, step: str) -> str:
    """A button's value: which incident and which step the click decides (a move: its id
    and the step `move`)."""
    return json.dumps({"incident_id": incident_id, "step": step}, separators=(",", ":"))


def parse_approval_value(value: str) -> tuple[str, str]:
    """The (incident_id, step) of a button value; ValueError when it is not ours."""
    try:
        data = json.loads(value)
        incident_id, step = data["incident_id"], data["step"]
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"not an approval button value: {value!r}") from e
    if not isinstance(incident_id, str) or not isinstance(step, str) or not incident_id:
        raise ValueError(f"not an approval button value: {value!r}")
    return incident_id, step


def _mention(severity: str, page_group_id: str | None) -> Mrkdwn:
    if severity != "critical" or not (group := group_mention(page_group_id)):
        return Mrkdwn("")
    return markup("{group} ", group=group)


def event_text(note: Notification, *, page_group_id: str | None = None) -> Mrkdwn:
    """A thread reply: one event, in order, paging the group when it is critical."""
    return markup(
        "{mention}{mark} *{event}*: {text}",
        mention=_mention(note.severity, page_group_id),
        mark=EVENT_MARKS.get(note.event, ":information_source:"),
        event=note.event,
        text=note.text,
    )


def card_message(
    card: IncidentCard, links: Links, *, page_group_id: str | None = None
) -> tuple[Mrkdwn, list[dict[str, Any]]]:
    """The (fallback text, Block Kit blocks) of the incident's message. Every value from
    the card is outside text (the alert's words, the node's name): escaped, cut to size."""
    mark = EVENT_MARKS.get(card.event, ":information_source:")
    mention = _mention(card.severity, page_group_id)
    fallback = markup(
        "{mention}[{state}] {fault} on {node} ({cluster}): {text}",
        mention=mention, state=card.state, fault=card.subject, node=card.node,
        cluster=card.cluster, text=card.text,
    )  # fmt: skip
    field: list[tuple[str, object]] = [
        ("Node", code(card.node)),
        ("Cluster", card.cluster),
        ("Feature", card.subject) if card.is_move else ("Fault", code(card.fault)),
        ("Action", card.rung or "to be decided"),
        ("State", card.state),
        ("Severity", card.severity),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": plain_object(f"{card.subject} on {card.node}", MAX_HEADER)},
        {
            "type": "section",
            "text": text_object(
                markup("{mention}{mark} {text}", mention=mention, mark=mark, text=card.text)
            ),
        },
        {
            "type": "section",
            "fields": [text_object(markup("*{k}*\n{v}", k=k, v=v), MAX_FIELD) for k, v in field],
        },
    ]
    if card.headline:
        blocks.append({"type": "section", "text": text_object(escape(card.headline))})
    refs = [
        markup(
            "{what} {id}", what="move" if card.is_move else "incident", id=code(card.incident_id)
        )
    ]
    if url := links.workflow(card):
        refs.append(link(url, "Temporal workflow", schemes=WEB) or escape(url))
    if url := links.incident(card):
        refs.append(link(url, "API", schemes=WEB) or escape(url))
    if runbook := link(card.runbook_url, "runbook"):  # https only: it came with the alert
        refs.append(runbook)
    refs.append(escape(f"updated {card.updated_at:%Y-%m-%d %H:%M:%S} UTC"))
    blocks.append({"type": "context", "elements": [text_object(join(refs, " · "))]})
    if card.waiting_step and card.event in APPROVAL_EVENTS:
        blocks.append(_approval_block(card, card.waiting_step))
    return fallback, blocks


def _approval_block(card: IncidentCard, step: str) -> dict[str, Any]:
    value = approval_value(card.incident_id, step)
    question = (
        f"move {card.incident_id} of {card.node}"
        if card.is_move
        else f"{step} of {card.node} ({card.fault})"
    )

    def button(action: str, label: str, style: str) -> dict[str, Any]:
        return {
            "type": "button",
            "action_id": action,
            "text": plain_object(label, MAX_BUTTON),
            "style": style,
            "value": value,
            "confirm": {
                "title": plain_object(f"{label}?", MAX_CONFIRM_TITLE),
                "text": text_object(
                    markup("{label} {question}?", label=label, question=question),
                    MAX_CONFIRM_TEXT,
                ),
                "confirm": plain_object(label, MAX_CONFIRM_BUTTON),
                "deny": plain_object("Cancel", MAX_CONFIRM_BUTTON),
            },
        }

    # Jobs back on the node after their requeue: approve cancels them, reject waits.
    yes, no = ("Cancel the jobs", "Wait") if step == RETURNED_JOBS_STEP else ("Approve", "Reject")
    return {
        "type": "actions",
        # A new block_id per step: Slack asks for one per iteration of an updated message.
        "block_id": f"{APPROVAL_BLOCK_PREFIX}:{step}",
        "elements": [
            button("approve", yes, "primary"),
            button("reject", no, "danger"),
        ],
    }


def decided_blocks(blocks: list[dict[str, Any]], line: Mrkdwn) -> list[dict[str, Any]]:
    """`blocks` with the Approve / Reject buttons replaced by `line` (who decided, when)."""
    kept = [
        b
        for b in blocks
        if not (
            b.get("type") == "actions"
            and str(b.get("block_id", "")).startswith(APPROVAL_BLOCK_PREFIX)
        )
    ]
    kept.append({"type": "context", "elements": [text_object(line)]})
    return kept


def card_metadata(card: IncidentCard) -> dict[str, Any]:
    """Message metadata that lets a worker with no local record find the message again."""
    payload = {
        "incident_id": card.incident_id,
        "cluster": card.cluster,
        "node": card.node,
        "fault": card.fault,
        "rung": card.rung or "",
        "event": card.event,
        "severity": card.severity,
    }
    return {"event_type": METADATA_EVENT_TYPE, "event_payload": payload}
