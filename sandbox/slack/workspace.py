"""The Slack emulator's workspace: channels, messages, threads, user groups, faults.

Kept apart from the HTTP layer (`sandbox/slack/emulator.py`) so what a method does is
plain Python: each `call` either returns the fields Slack would answer besides `"ok"`,
or raises `ApiError` with Slack's error code. Message timestamps are unique and grow,
as Slack's do, so they order a channel and name a message.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ApiError", "Fault", "Workspace", "WorkspaceConfig"]

BOT_USER = "U0AUTOBOT"
BOT_ID = "B0AUTOBOT"


class ApiError(Exception):
    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class WorkspaceConfig(BaseModel):
    token: str
    signing_secret: str
    channels: list[str] = Field(default_factory=lambda: ["incidents"])
    interactivity_url: str | None = None
    team_id: str = "T0SANDBOX"
    users: dict[str, str] = Field(default_factory=dict)  # user id -> username
    usergroups: dict[str, list[str]] = Field(default_factory=dict)  # group id -> user ids


class Fault(BaseModel):
    method: str | None = None  # None: every API method
    count: int | None = 1  # None: until cleared (an outage)
    status: int = 200  # 429: ratelimited with Retry-After; >= 500: an HTML error page
    error: str | None = None  # with status 200: {"ok": false, "error": error}
    retry_after: int | None = None
    delay_s: float = 0  # wait this long before answering (a slow or hung Slack)


class Message(BaseModel):
    ts: str
    channel: str
    text: str = ""
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None
    thread_ts: str | None = None
    reply_broadcast: bool = False
    user: str = BOT_USER
    edits: int = 0


class Ephemeral(BaseModel):
    ts: str
    channel: str
    user: str
    text: str = ""
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    thread_ts: str | None = None


class Channel(BaseModel):
    id: str
    name: str
    messages: list[Message] = Field(default_factory=list)  # in the order posted
    ephemeral: list[Ephemeral] = Field(default_factory=list)


class ApiCall(BaseModel):
    method: str
    status: int
    error: str | None
    at: float
    args: dict[str, Any]


class Workspace:
    def __init__(self, config: WorkspaceConfig) -> None:
        self.config = config
        self.channels: dict[str, Channel] = {}
        for i, name in enumerate(config.channels, start=1):
            name = name.lstrip("#")
            self.channels[f"C{i:08d}"] = Channel(id=f"C{i:08d}", name=name)
        self.faults: list[Fault] = []
        self.calls: list[ApiCall] = []
        self.response_posts: list[dict[str, str]] = []
        self._last_us = 0
        self._clicks = 0
        self._methods: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "auth.test": self._auth_test,
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "chat.postEphemeral": self._post_ephemeral,
            "conversations.history": self._history,
            "conversations.replies": self._replies,
            "usergroups.users.list": self._group_users,
        }

    # --- plumbing ------------------------------------------------------------------------

    def next_ts(self) -> str:
        us = max(self._last_us + 1, int(time.time() * 1_000_000))
        self._last_us = us
        return f"{us // 1_000_000}.{us % 1_000_000:06d}"

    def take_fault(self, method: str) -> Fault | None:
        for f in self.faults:
            if f.method in (None, method):
                if f.count is not None:
                    f.count -= 1
                    if f.count <= 0:
                        self.faults.remove(f)
                return f
        return None

    def record(self, method: str, args: dict[str, Any], status: int, error: str | None) -> None:
        shown = {k: v for k, v in args.items() if k != "token"}
        self.calls.append(
            ApiCall(method=method, status=status, error=error, at=time.time(), args=shown)
        )

    def authenticate(self, token: str | None) -> None:
        if not token:
            raise ApiError("not_authed")
        if token != self.config.token:
            raise ApiError("invalid_auth")

    def call(self, method: str, args: dict[str, Any]) -> dict[str, Any]:
        fn = self._methods.get(method)
        if fn is None:
            raise ApiError("unknown_method")
        return fn(args)

    def channel(self, ref: str) -> Channel:
        ref = str(ref or "").lstrip("#")
        if ref in self.channels:
            return self.channels[ref]
        for c in self.channels.values():
            if c.name == ref:
                return c
        raise ApiError("channel_not_found")

    def message(self, channel: Channel, ts: str) -> Message:
        for m in channel.messages:
            if m.ts == ts:
                return m
        raise ApiError("message_not_found")

    # --- methods -------------------------------------------------------------------------

    def _auth_test(self, args: dict[str, Any]) -> dict[str, Any]:
        return {
            "url": "https://sandbox.slack.local/",
            "team": "sandbox",
            "user": "autoclusters",
            "team_id": self.config.team_id,
            "user_id": BOT_USER,
            "bot_id": BOT_ID,
        }

    def _post_message(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channel(args.get("channel", ""))
        text, blocks = str(args.get("text") or ""), _json_arg(args.get("blocks")) or []
        if not text and not blocks:
            raise ApiError("no_text")
        thread_ts = args.get("thread_ts") or None
        if thread_ts is not None:
            parent = self.message(ch, str(thread_ts))
            thread_ts = parent.thread_ts or parent.ts  # a reply to a reply joins its thread
        msg = Message(
            ts=self.next_ts(),
            channel=ch.id,
            text=text,
            blocks=blocks,
            metadata=_json_arg(args.get("metadata")),
            thread_ts=thread_ts,
            reply_broadcast=_truthy(args.get("reply_broadcast")),
        )
        ch.messages.append(msg)
        return {"channel": ch.id, "ts": msg.ts, "message": _wire(msg, metadata=True)}

    def _update(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channel(args.get("channel", ""))
        msg = self.message(ch, str(args.get("ts", "")))
        if "text" in args:
            msg.text = str(args["text"] or "")
        if "blocks" in args:
            msg.blocks = _json_arg(args["blocks"]) or []
        if args.get("metadata") is not None:
            msg.metadata = _json_arg(args["metadata"])
        msg.edits += 1
        return {"channel": ch.id, "ts": msg.ts, "text": msg.text, "message": _wire(msg)}

    def _post_ephemeral(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channel(args.get("channel", ""))
        if not args.get("user"):
            raise ApiError("user_not_found")
        e = Ephemeral(
            ts=self.next_ts(),
            channel=ch.id,
            user=str(args["user"]),
            text=str(args.get("text") or ""),
            blocks=_json_arg(args.get("blocks")) or [],
            thread_ts=args.get("thread_ts") or None,
        )
        ch.ephemeral.append(e)
        return {"message_ts": e.ts}

    def _history(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channel(args.get("channel", ""))
        limit = max(1, min(int(args.get("limit") or 100), 999))
        start = int(str(args.get("cursor") or "next_0").removeprefix("next_") or 0)
        top = [m for m in reversed(ch.messages) if m.thread_ts is None or m.reply_broadcast]
        page = top[start : start + limit]
        more = start + limit < len(top)
        meta = _truthy(args.get("include_all_metadata"))
        return {
            "messages": [self._history_wire(ch, m, metadata=meta) for m in page],
            "has_more": more,
            "response_metadata": {"next_cursor": f"next_{start + limit}" if more else ""},
        }

    def _replies(self, args: dict[str, Any]) -> dict[str, Any]:
        ch = self.channel(args.get("channel", ""))
        parent = self.message(ch, str(args.get("ts", "")))
        thread = [parent] + [m for m in ch.messages if m.thread_ts == parent.ts]
        meta = _truthy(args.get("include_all_metadata"))
        return {"messages": [_wire(m, metadata=meta) for m in thread], "has_more": False}

    def _group_users(self, args: dict[str, Any]) -> dict[str, Any]:
        group = str(args.get("usergroup") or "")
        if group not in self.config.usergroups:
            raise ApiError("no_such_subteam")
        return {"users": list(self.config.usergroups[group])}

    def _history_wire(self, ch: Channel, m: Message, *, metadata: bool) -> dict[str, Any]:
        out = _wire(m, metadata=metadata)
        replies = [r for r in ch.messages if r.thread_ts == m.ts]
        if replies:
            out["reply_count"] = len(replies)
            out["latest_reply"] = replies[-1].ts
        return out

    # --- controls ------------------------------------------------------------------------

    def channel_view(self, ref: str) -> dict[str, Any]:
        """A channel as a reader sees it: messages with their thread replies, in order."""
        ch = self.channel(ref)
        parents = [m for m in ch.messages if m.thread_ts is None]
        return {
            "id": ch.id,
            "name": ch.name,
            "messages": [
                {
                    **m.model_dump(),
                    "replies": [r.model_dump() for r in ch.messages if r.thread_ts == m.ts],
                }
                for m in parents
            ],
            "ephemeral": [e.model_dump() for e in ch.ephemeral],
        }

    def click_payload(
        self, *, incident_id: str, action: str, user: str, base_url: str
    ) -> dict[str, Any]:
        """The block_actions payload Slack would send for this click."""
        found = self._button(incident_id, action)
        if found is None:
            raise ApiError(f"no message carries {action} buttons for {incident_id}")
        ch, msg, block, button = found
        self._clicks += 1
        name = self.config.users.get(user, user.lower())
        team = self.config.team_id
        container: dict[str, Any] = {
            "type": "message",
            "message_ts": msg.ts,
            "channel_id": ch.id,
            "is_ephemeral": False,
        }
        if msg.thread_ts:
            container["thread_ts"] = msg.thread_ts
        action_ts = self.next_ts()
        return {
            "type": "block_actions",
            "user": {"id": user, "username": name, "name": name, "team_id": team},
            "api_app_id": "A0AUTOCLUSTERS",
            "token": "legacy-verification-token",
            "container": container,
            "trigger_id": f"{self._clicks}.{team}.{abs(hash(action_ts)):x}",
            "team": {"id": team, "domain": "sandbox"},
            "enterprise": None,
            "is_enterprise_install": False,
            "channel": {"id": ch.id, "name": ch.name},
            "message": _wire(msg),
            "state": {"values": {}},
            "response_url": f"{base_url}/_emulator/response_url/{self._clicks}",
            "actions": [
                {
                    "type": "button",
                    "action_id": button["action_id"],
                    "block_id": block.get("block_id", ""),
                    "text": button.get("text", {}),
                    "value": button.get("value", ""),
                    "style": button.get("style"),
                    "action_ts": action_ts,
                }
            ],
        }

    def _button(
        self, incident_id: str, action: str
    ) -> tuple[Channel, Message, dict[str, Any], dict[str, Any]] | None:
        candidates = [(c, m) for c in self.channels.values() for m in c.messages]
        for ch, msg in sorted(candidates, key=lambda cm: float(cm[1].ts), reverse=True):
            for block in msg.blocks:
                if block.get("type") != "actions":
                    continue
                for el in block.get("elements", []):
                    if el.get("action_id") == action and _incident_of(el) == incident_id:
                        return ch, msg, block, el
        return None


def _incident_of(element: dict[str, Any]) -> str | None:
    try:
        value = json.loads(element.get("value") or "")
    except ValueError:
        return None
    return value.get("incident_id") if isinstance(value, dict) else None


def _wire(m: Message, *, metadata: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "message",
        "user": m.user,
        "bot_id": BOT_ID,
        "ts": m.ts,
        "text": m.text,
        "blocks": m.blocks,
    }
    if m.thread_ts:
        out["thread_ts"] = m.thread_ts
        if m.reply_broadcast:
            out["subtype"] = "thread_broadcast"
    if m.edits:
        out["edited"] = {"user": m.user, "ts": m.ts}
    if metadata and m.metadata:
        out["metadata"] = m.metadata
    return out


def _json_arg(value: Any) -> Any:
    """A structured argument: as JSON sends it, or as the JSON string a form carries."""
    if isinstance(value, str):
        try:
            return json.loads(value) if value else None
        except ValueError as e:
            raise ApiError("invalid_arguments") from e
    return value


def _truthy(value: Any) -> bool:
    return str(value).lower() in ("1", "true", "yes")
