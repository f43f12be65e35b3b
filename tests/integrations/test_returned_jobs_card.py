"""The Slack card for jobs back on the node after their requeue: its buttons say what they
do (cancel the jobs / wait), carry the step the workflow waits on, and leave the card's
planned repair as it was."""

from __future__ import annotations

from typing import Any

from autoclusters.core.models import RETURNED_JOBS_STEP, Notification
from autoclusters.integrations.slack.cards import (
    IncidentCard,
    Links,
    card_message,
    parse_approval_value,
)


def _note(event: str, text: str) -> Notification:
    return Notification(
        incident_id="INC-7", cluster="c1", node="gpu-01", fault="XID_79", event=event, text=text
    )


def _buttons(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for b in blocks if b["type"] == "actions" for e in b["elements"]]


def test_the_returned_jobs_question_has_cancel_and_wait_buttons() -> None:
    opened = _note("opened", "XID_79 on gpu-01: plan reboot (mode approve)")
    card = IncidentCard.for_note(opened).apply(opened)
    asked = _note(
        "approval_needed",
        f"{RETURNED_JOBS_STEP} of gpu-01 needs approval by one of ['alice']: jobs [101] were "
        "requeued once for XID_79 and run on gpu-01 again. Approve: cancel them; reject: wait",
    )
    card = card.apply(asked)
    assert card.waiting_step == RETURNED_JOBS_STEP
    assert card.rung == "reboot"  # a decision about jobs, not a new repair
    _, blocks = card_message(card, Links())
    buttons = _buttons(blocks)
    assert [(b["action_id"], b["text"]["text"]) for b in buttons] == [
        ("approve", "Cancel the jobs"),
        ("reject", "Wait"),
    ]
    assert {parse_approval_value(b["value"]) for b in buttons} == {("INC-7", RETURNED_JOBS_STEP)}


def test_a_repair_approval_keeps_approve_and_reject() -> None:
    asked = _note("approval_needed", "reboot of gpu-01 needs approval by one of ['alice']")
    card = IncidentCard.for_note(asked).apply(asked)
    labels = [b["text"]["text"] for b in _buttons(card_message(card, Links())[1])]
    assert labels == ["Approve", "Reject"]
