"""Text that reaches Slack: words from outside are data, our own markup is the only markup.

Slack reads `&`, `<` and `>` as the control characters of `mrkdwn` (`<!channel>`,
`<@U…>`, `<#C…>`, `<!subteam^S…>`, `<https://…|label>`) and asks that text not meant for
that parsing carry them as `&amp;`, `&lt;`, `&gt;` ("Formatting text for app surfaces",
escaping). Whoever controls an alert's annotations, a Slurm reason, a node or job name or
a policy string must not be able to page the channel or put a link labelled "Approve"
beside the real buttons, so every such value goes through `escape` here, at the boundary,
and only this module makes `Mrkdwn`.

`Mrkdwn` is text that is safe to send as mrkdwn. Cards build it with `markup(template,
**values)`: the template is our own literal, every value that is not already `Mrkdwn` is
escaped. A plain `str` given where `Mrkdwn` is expected is a type error, and is escaped at
run time anyway (`text_object`, `message_text`), so a forgotten call fails safe: the
reader sees `&lt;` rather than a mention.

Escaping alone leaves some things: control characters and the bidi marks that reorder text
on screen (U+202A–U+202E, U+2066–U+2069, U+200E/F, U+061C) are dropped; a bare
`@here`/`@channel`/`@everyone` gets a full-width ＠ so no parser pages on it; every text
object is cut to Slack's limit without splitting an entity or our own `<…>`; mrkdwn text
objects are sent `verbatim` so Slack does not turn outside words into links. The emphasis
characters (`*`, `_`, `~`) stay as written: they can bold a word, never mention anyone or
link anywhere; a value shown in a code span cannot close it (its backticks become ˋ).
Links come only from fields meant to be links, with an `https` URL (`link`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, LiteralString
from urllib.parse import urlsplit

__all__ = [
    "HTTPS",
    "MAX_BUTTON",
    "MAX_CONFIRM_BUTTON",
    "MAX_CONFIRM_TEXT",
    "MAX_CONFIRM_TITLE",
    "MAX_FIELD",
    "MAX_HEADER",
    "MAX_MESSAGE",
    "MAX_TEXT_OBJECT",
    "WEB",
    "Mrkdwn",
    "clean",
    "code",
    "cut",
    "escape",
    "group_mention",
    "join",
    "link",
    "markup",
    "message_text",
    "plain",
    "plain_object",
    "text_object",
    "user",
]

# Block Kit's limits (characters): a payload over any of them is refused `invalid_blocks`.
MAX_TEXT_OBJECT = 3000  # a section's or a context element's text
MAX_FIELD = 2000  # one of a section's fields
MAX_HEADER = 150  # a header's plain_text
MAX_BUTTON = 75
MAX_CONFIRM_TITLE = 100
MAX_CONFIRM_TEXT = 300
MAX_CONFIRM_BUTTON = 30
# A message's `text`: Slack cuts at 40,000 and advises under 4,000; the whole story is in
# the Temporal UI and the API, the channel needs the gist.
MAX_MESSAGE = 4000
MAX_URL = 2000

HTTPS: frozenset[str] = frozenset({"https"})  # outside links: http is refused, not downgraded
WEB: frozenset[str] = frozenset({"http", "https"})  # our own configured URLs (the sandbox's UI)

ELLIPSIS = "…"

# Dropped: C0 and C1 controls (but newline and tab), DEL, and the marks that reorder text
# on screen so that a name reads as something else. Lone surrogates (JSON allows them)
# become U+FFFD so the payload still encodes. Line and paragraph separators are newlines.
_BIDI = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))
_CLEAN: dict[int, str | None] = {
    **{c: None for c in (*range(0x20), 0x7F, *range(0x80, 0xA0), *_BIDI)},
    **{c: "\ufffd" for c in range(0xD800, 0xE000)},
    ord("\n"): "\n",
    ord("\t"): " ",
    ord("\r"): "\n",
    0x2028: "\n",
    0x2029: "\n",
}
_MASS_MENTION = re.compile(r"@(?=(?:here|channel|everyone)\b)", re.IGNORECASE)
# Slack's ids are capitals and digits (U…/W… users, S… user groups); the sandbox's carry
# underscores. None of these characters can end the `<@…>` around them.
_USER_ID = re.compile(r"[UW][A-Z0-9_]{1,30}")
_GROUP_ID = re.compile(r"S[A-Z0-9_]{1,30}")
_URL_UNSAFE = re.compile(r"[\s<>|\"'`\\]")


class Mrkdwn(str):
    """Text safe to send as Slack mrkdwn: escaped outside words and our own markup only.

    Made by this module's functions; `markup` and `join` keep a value that already is one.
    """

    __slots__ = ()


def clean(raw: object) -> str:
    """`raw` as text without control characters or bidi marks (newlines kept)."""
    return str(raw).replace("\r\n", "\n").translate(_CLEAN)


def escape(raw: object) -> Mrkdwn:
    """Outside text as mrkdwn that shows it as written and parses nothing of it."""
    text = clean(raw).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return Mrkdwn(_MASS_MENTION.sub("＠", text))


def cut(text: Mrkdwn, limit: int) -> Mrkdwn:
    """At most `limit` characters, ending in … when cut; never inside an entity (`&am`)
    nor inside our own `<…>` (outside text has no `<` left, so any `<` is ours)."""
    if len(text) <= limit:
        return text
    head = text[: limit - len(ELLIPSIS)]
    if (lt := head.rfind("<")) > head.rfind(">"):
        head = head[:lt]
    if (amp := head.rfind("&")) != -1 and ";" not in head[amp:]:
        head = head[:amp]
    return Mrkdwn(head + ELLIPSIS)


def plain(raw: object, limit: int) -> str:
    """Outside text for a `plain_text` object (Slack parses none of it): one clean line,
    at most `limit` characters."""
    text = " ".join(clean(raw).split("\n"))
    return text if len(text) <= limit else text[: limit - len(ELLIPSIS)] + ELLIPSIS


def markup(template: LiteralString, /, **values: object) -> Mrkdwn:
    """Our own mrkdwn `template` (a literal in our code) with its `{name}`s filled: a
    `Mrkdwn` value as it is, any other value escaped. No format specs: the values are
    text by the time they are placed."""
    safe = {k: v if isinstance(v, Mrkdwn) else escape(v) for k, v in values.items()}
    return Mrkdwn(template.format_map(safe))


def join(parts: Iterable[object], sep: LiteralString = "") -> Mrkdwn:
    """`parts` joined by our own `sep`; a part that is not `Mrkdwn` is escaped."""
    return Mrkdwn(sep.join(p if isinstance(p, Mrkdwn) else escape(p) for p in parts))


def code(raw: object, *, limit: int = 200) -> Mrkdwn:
    """`raw` in an inline code span, on one line; a backtick in it cannot close the span."""
    one_line = " ".join(clean(raw).split("\n")).replace("`", "ˋ")
    return Mrkdwn(f"`{cut(escape(one_line), limit)}`")


def link(url: str, label: str, *, schemes: frozenset[str] = HTTPS) -> Mrkdwn | None:
    """`<url|label>` when `url` is an absolute URL with one of `schemes` (default: https
    only) and nothing that could end the link early; None otherwise (show it as text)."""
    if not url or len(url) > MAX_URL or _URL_UNSAFE.search(url) or clean(url) != url:
        return None
    try:
        parts = urlsplit(url)
    except ValueError:  # e.g. an unbalanced [ in the host
        return None
    if parts.scheme.lower() not in schemes or not parts.hostname:
        return None
    return Mrkdwn(f"<{url.replace('&', '&amp;')}|{escape(label)}>")


def user(user_id: str) -> Mrkdwn:
    """A mention of the Slack user `user_id` (an id from Slack's signed payload); text
    that does not look like a Slack id is shown escaped, never as a mention."""
    return Mrkdwn(f"<@{user_id}>") if _USER_ID.fullmatch(user_id) else escape(user_id)


def group_mention(group_id: str | None) -> Mrkdwn:
    """A mention of the user group `group_id` (the configured paging group), or nothing
    when it does not look like a Slack user group id."""
    ok = group_id is not None and _GROUP_ID.fullmatch(group_id)
    return Mrkdwn(f"<!subteam^{group_id}>") if ok else Mrkdwn("")


def text_object(text: Mrkdwn, limit: int = MAX_TEXT_OBJECT) -> dict[str, Any]:
    """A mrkdwn text object within `limit`; `verbatim` so Slack links no bare URL or
    channel name in it (our own `<…>` still render)."""
    safe = text if isinstance(text, Mrkdwn) else escape(text)  # a forgotten escape fails safe
    return {"type": "mrkdwn", "text": str(cut(safe, limit)) or "-", "verbatim": True}


def plain_object(raw: object, limit: int) -> dict[str, Any]:
    """A plain_text object within `limit` (Slack asks for at least one character)."""
    return {"type": "plain_text", "text": plain(raw, limit) or "-"}


def message_text(text: Mrkdwn) -> str:
    """A message's `text` (the notification line, a thread reply) within `MAX_MESSAGE`."""
    safe = text if isinstance(text, Mrkdwn) else escape(text)  # a forgotten escape fails safe
    return str(cut(safe, MAX_MESSAGE))
