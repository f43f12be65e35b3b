"""Slack button clicks → approval decisions: what `POST /slack/interactions` does.

Slack POSTs a click as `application/x-www-form-urlencoded` with one field, `payload`
(a JSON `block_actions` payload), signed with the app's signing secret. The handler:

1. verifies the signature over the raw body before reading anything from it
   (`v0=` + HMAC-SHA256 of `v0:{timestamp}:{raw body}`; a timestamp more than five
   minutes away, past or future, is refused): failure → 401, nothing decided;
2. parses the payload; a click that is not an Approve / Reject button of ours is
   acknowledged and ignored;
3. maps the Slack user to an approver name (the configured mapping, else membership of
   the approver user group as the Slack username); nobody → an ephemeral refusal;
4. calls the injected `decide(incident_id=, step=, approver=, approve=, comment=)` with the
   step the button was rendered for, so the incident refuses it unless it waits on exactly
   that step (a stale or replayed click never approves a later step); a refusal
   (`PermissionError`, e.g. DecisionRefused: already decided, incident closed, not an
   approver by policy) or `LookupError` (IncidentNotFound) → an ephemeral message to
   the clicker with the reason;
5. on success replaces the buttons with "Approved by <user> at <time>" (`chat.update`)
   and says so in the incident's thread.

A GPU sharing's move waiting for approval has the same buttons, with the move id in
`incident_id` and the step `move`; `decide` routes those to the sharing workflow (the API's
does), which refuses a move that is not waiting, and the messages name the move.

Each authentic request is processed at most once: a byte-identical request seen within the
last `remember_s` (longer than the 5-minute signature window, after which a replay fails
the signature check anyway) is answered `duplicate` and decides nothing.

Every click is acknowledged with 200 once it is authentic, so Slack shows no error; the
body says what happened (`{"ok": true, "outcome": ...}`). Slack calls after the decision
(update, ephemeral) are best effort: the decision is already in the incident's history.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qs

from pydantic import BaseModel, Field
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from autoclusters.core.sharing import MOVE_APPROVAL_STEP
from autoclusters.core.slack_config import SlackConfig
from autoclusters.integrations.slack.cards import decided_blocks, parse_approval_value
from autoclusters.integrations.slack.client import web_client_for
from autoclusters.integrations.slack.escape import Mrkdwn, markup, message_text, user

__all__ = [
    "ApproverDirectory",
    "Click",
    "Decide",
    "InteractionHandler",
    "InteractionResponse",
    "parse_click",
]

log = logging.getLogger("autoclusters.integrations.slack")

ACTIONS = {"approve": True, "reject": False}


class InteractionResponse(BaseModel):
    """What the HTTP route answers: `status_code` with `body` as JSON."""

    status_code: int
    body: dict[str, Any] = Field(default_factory=dict)


class Decide(Protocol):
    """Records a decision; raises PermissionError / LookupError when it is refused. `via`
    says how the approver was verified (`slack:<user id>`, from the signed payload)."""

    def __call__(
        self, *, incident_id: str, step: str, approver: str, approve: bool, comment: str,
        via: str,
    ) -> Awaitable[object]: ...  # fmt: skip


class Click(BaseModel):
    """One Approve / Reject click, as the handler needs it."""

    incident_id: str
    step: str
    approve: bool
    user_id: str
    username: str
    channel_id: str
    message_ts: str
    thread_ts: str  # the thread to tell: the message's own, or the message itself
    blocks: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def what(self) -> str:
        """What the click decides, in words: the incident's step, or the move."""
        if self.step == MOVE_APPROVAL_STEP:
            return f"move {self.incident_id}"
        return self.step


def parse_click(payload: Mapping[str, Any]) -> Click | None:
    """The click in a `block_actions` payload; None for any other interaction.

    Raises ValueError when the payload claims to be our button but is malformed.
    """
    actions = payload.get("actions") or []
    if payload.get("type") != "block_actions" or not actions:
        return None
    action = actions[0]
    if action.get("action_id") not in ACTIONS:
        return None
    incident_id, step = parse_approval_value(str(action.get("value", "")))
    user = payload.get("user") or {}
    container = payload.get("container") or {}
    message = payload.get("message") or {}
    channel_id = container.get("channel_id") or (payload.get("channel") or {}).get("id")
    message_ts = container.get("message_ts") or message.get("ts")
    if not user.get("id") or not channel_id or not message_ts:
        raise ValueError("block_actions payload without user, channel or message")
    return Click(
        incident_id=incident_id,
        step=step,
        approve=ACTIONS[action["action_id"]],
        user_id=str(user["id"]),
        username=str(user.get("username") or user.get("name") or user["id"]),
        channel_id=str(channel_id),
        message_ts=str(message_ts),
        thread_ts=str(container.get("thread_ts") or message.get("thread_ts") or message_ts),
        blocks=list(message.get("blocks") or []),
    )


class ApproverDirectory:
    """Who may decide: a Slack user id → approver name mapping, and/or a user group.

    A member of `group_id` not in `users` decides as their Slack username (the name the
    remediation policy's `approvers` must list). Group membership is read with
    `usergroups.users.list` and cached for `cache_s`.
    """

    def __init__(
        self,
        *,
        users: Mapping[str, str] | None = None,
        group_id: str | None = None,
        client: AsyncWebClient | None = None,
        cache_s: float = 60.0,
    ) -> None:
        if group_id and client is None:
            raise ValueError("an approver group needs a Slack client to read its members")
        self._users = dict(users or {})
        self._group_id = group_id
        self._client = client
        self._cache_s = cache_s
        self._members: frozenset[str] = frozenset()
        self._members_at = float("-inf")

    async def approver_for(self, *, user_id: str, username: str) -> str | None:
        if user_id in self._users:
            return self._users[user_id]
        if self._group_id and user_id in await self._group_members():
            return username
        return None

    async def _group_members(self) -> frozenset[str]:
        if time.monotonic() - self._members_at < self._cache_s:
            return self._members
        assert self._client is not None and self._group_id is not None
        try:
            resp = await self._client.usergroups_users_list(usergroup=self._group_id)
        except SlackApiError as e:
            log.warning("Slack: members of %s unreadable: %s", self._group_id, e)
            return self._members  # the last known members, however old
        self._members = frozenset(str(u) for u in resp.get("users") or [])
        self._members_at = time.monotonic()
        return self._members


class _Clock(Clock):
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class InteractionHandler:
    """Turns a Slack interactivity request into a decision and an HTTP answer.

    Example (FastAPI):
        @app.post("/slack/interactions")
        async def interactions(request: Request) -> Response:
            r = await handler.handle(await request.body(), request.headers)
            return JSONResponse(r.body, status_code=r.status_code)
    """

    def __init__(
        self,
        *,
        signing_secret: str,
        client: AsyncWebClient,
        decide: Decide,
        approvers: ApproverDirectory,
        now: Callable[[], float] = time.time,
        remember_s: float = 600.0,
    ) -> None:
        self._verifier = SignatureVerifier(signing_secret, clock=_Clock(now))
        self._client = client
        self._decide = decide
        self._approvers = approvers
        self._now = now
        self._remember_s = remember_s
        # sha256 of each authentic request body -> when it was first processed.
        self._seen: OrderedDict[str, float] = OrderedDict()

    @classmethod
    def from_config(cls, config: SlackConfig, *, decide: Decide) -> InteractionHandler:
        if config.signing_secret is None:
            raise ValueError("Slack interactivity needs the app's signing secret")
        client = web_client_for(config)
        return cls(
            signing_secret=config.signing_secret.get_secret_value(),
            client=client,
            decide=decide,
            approvers=ApproverDirectory(
                users=config.approvers, group_id=config.approver_group_id, client=client
            ),
        )

    def verify(self, body: bytes, headers: Mapping[str, str]) -> bool:
        """True when the raw `body` carries a valid signature from within five minutes."""
        try:
            return self._verifier.is_valid_request(body, dict(headers.items()))
        except (ValueError, TypeError):  # a timestamp that is not a number
            return False

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> InteractionResponse:
        """The whole request: signature, then payload. The body must be the raw bytes."""
        if not self.verify(body, headers):
            return InteractionResponse(
                status_code=401, body={"ok": False, "error": "invalid_signature"}
            )
        if self._seen_before(body):
            return InteractionResponse(status_code=200, body={"ok": True, "outcome": "duplicate"})
        try:
            fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
            payload = json.loads(fields["payload"][0])
        except (UnicodeDecodeError, ValueError, KeyError, IndexError):
            return InteractionResponse(status_code=400, body={"ok": False, "error": "no_payload"})
        if not isinstance(payload, dict):
            return InteractionResponse(status_code=400, body={"ok": False, "error": "no_payload"})
        return await self.handle_payload(payload)

    def _seen_before(self, body: bytes) -> bool:
        """Remember this request; True if it was processed already."""
        now = self._now()
        while self._seen and next(iter(self._seen.values())) < now - self._remember_s:
            self._seen.popitem(last=False)
        key = hashlib.sha256(body).hexdigest()
        if key in self._seen:
            return True
        self._seen[key] = now
        return False

    async def handle_payload(self, payload: Mapping[str, Any]) -> InteractionResponse:
        """An already authenticated payload (HTTP after `verify`, or Socket Mode)."""
        try:
            click = parse_click(payload)
        except ValueError as e:
            return InteractionResponse(status_code=400, body={"ok": False, "error": str(e)})
        if click is None:
            return InteractionResponse(status_code=200, body={"ok": True, "outcome": "ignored"})
        approver = await self._approvers.approver_for(
            user_id=click.user_id, username=click.username
        )
        if approver is None:
            await self._tell(
                click, markup("You are not allowed to approve or reject {what}.", what=click.what)
            )
            return _outcome("not_allowed", click)
        verb = "approve" if click.approve else "reject"
        try:
            await self._decide(
                incident_id=click.incident_id,
                step=click.step,
                approver=approver,
                approve=click.approve,
                comment=f"via Slack by <@{click.user_id}>",
                via=f"slack:{click.user_id}",
            )
        except (PermissionError, LookupError) as e:
            await self._tell(
                click, markup("Could not {verb} {what}: {why}", verb=verb, what=click.what, why=e)
            )
            return _outcome("refused", click, reason=str(e))
        except Exception as e:  # noqa: BLE001 - Temporal down: tell the clicker to retry
            log.warning("Slack: %s of %s failed: %s", verb, click.incident_id, e)
            await self._tell(
                click,
                markup(
                    "Could not {verb} {what} now ({why}); try again.",
                    verb=verb,
                    what=click.what,
                    why=e,
                ),
            )
            return _outcome("error", click, reason=str(e))
        await self._mark_decided(click, approver)
        return _outcome("approved" if click.approve else "rejected", click, approver=approver)

    async def _mark_decided(self, click: Click, approver: str) -> None:
        at = datetime.fromtimestamp(self._now(), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        done = "Approved" if click.approve else "Rejected"
        # The approver's name and the step come from config, Slack and the button: escaped;
        # the clicker is mentioned only by a well-formed Slack user id.
        line = markup(
            "{done} by {who} ({approver}) at {at}: {what}",
            done=done, who=user(click.user_id), approver=approver, at=at, what=click.what,
        )  # fmt: skip
        mark = ":white_check_mark:" if click.approve else ":no_entry:"
        marked = markup("{mark} {line}", mark=mark, line=line)
        try:
            await self._client.chat_update(
                channel=click.channel_id,
                ts=click.message_ts,
                text=message_text(line),
                blocks=decided_blocks(click.blocks, marked),
            )
            await self._client.chat_postMessage(
                channel=click.channel_id, thread_ts=click.thread_ts, text=message_text(marked)
            )
        except Exception as e:  # noqa: BLE001 - the decision stands; the message is cosmetic
            log.warning("Slack: could not mark %s decided: %s", click.incident_id, e)

    async def _tell(self, click: Click, text: Mrkdwn) -> None:
        try:
            await self._client.chat_postEphemeral(
                channel=click.channel_id, user=click.user_id, text=message_text(text)
            )
        except Exception as e:  # noqa: BLE001 - the answer is best effort
            log.warning("Slack: could not tell %s: %s", click.user_id, e)


def _outcome(outcome: str, click: Click, **extra: str) -> InteractionResponse:
    body: dict[str, Any] = {
        "ok": True,
        "outcome": outcome,
        "incident_id": click.incident_id,
        "step": click.step,
        "user": click.user_id,
        **extra,
    }
    return InteractionResponse(status_code=200, body=body)
