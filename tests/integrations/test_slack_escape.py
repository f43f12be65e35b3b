"""What the Slack escaper makes of outside text (integrations/slack/escape.py), unit and
property tests; the same corpus through the notifier into the emulator is in
tests/integrations/test_slack_hostile_text.py.

- escaped text has no `<` or `>` of its own and every `&` starts an entity; reading the
  entities back gives the cleaned text (nothing else changed but a mass mention's ＠);
- control characters and bidi marks are gone, newlines stay, emoji sequences (ZWJ) stay;
- `markup` keeps our template and escapes every value that is not already `Mrkdwn`;
- `cut` keeps within the limit and never ends inside an entity or our own `<…>`;
- links: https only, refused for anything that could end the link early; the label escaped;
- mentions only of well-formed Slack ids.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoclusters.integrations.slack.escape import (
    HTTPS,
    MAX_HEADER,
    WEB,
    Mrkdwn,
    clean,
    code,
    cut,
    escape,
    group_mention,
    join,
    link,
    markup,
    message_text,
    plain_object,
    text_object,
    user,
)

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
ENTITY = re.compile(r"&(?!amp;|lt;|gt;)")
MASS = re.compile(r"@(?=(?:here|channel|everyone)\b)", re.IGNORECASE)
# Any text at all, with the characters that matter to Slack made likely.
outside = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(list("<>&|!@#^*_~`\n\r\t\x00\x1b\x7f\x85") + list(BIDI)),
    ),
    max_size=300,
)


def unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@given(outside)
def test_escaped_text_parses_nothing_and_reads_as_written(raw: str) -> None:
    out = escape(raw)
    assert "<" not in out and ">" not in out
    assert not ENTITY.search(out), out  # every & is one of Slack's three entities
    assert not any(c in out for c in BIDI)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out)
    assert not re.search(r"@(here|channel|everyone)\b", out, re.IGNORECASE)
    # Read back, it is the cleaned text: only a mass mention's @ became ＠.
    assert unescape(out) == MASS.sub("＠", clean(raw))


@given(outside, outside)
def test_markup_keeps_only_our_markup(a: str, b: str) -> None:
    ours = Mrkdwn("<!subteam^S0PAGERS>")
    out = markup("{mention} *{a}*: {b}", mention=ours, a=a, b=b)
    assert out.startswith("<!subteam^S0PAGERS> *")
    assert out.count("<") == 1 and out.count(">") == 1  # the mention's own, nothing else


@given(outside, st.integers(min_value=2, max_value=400))
def test_cut_stays_within_the_limit_and_never_splits_an_entity(raw: str, limit: int) -> None:
    out = cut(markup("{v} <https://x.example|link>", v=raw), limit)
    assert len(out) <= limit
    assert not ENTITY.search(out), out
    assert out.count("<") == out.count(">")  # our link is whole or gone


def test_control_characters_and_bidi_marks_are_dropped_newlines_and_emoji_stay() -> None:
    raw = "a\x00b\x07c\x1b[31m\x7f\x85d\r\ne\tf \u202egnp.exe\u202c 👨\u200d👩\u200d👧"
    assert clean(raw) == "abc[31md\ne f gnp.exe 👨\u200d👩\u200d👧"


def test_a_pre_escaped_entity_is_shown_as_written() -> None:
    assert escape("&lt;!channel&gt;") == "&amp;lt;!channel&amp;gt;"


def test_mass_mentions_are_defused_other_at_signs_are_not() -> None:
    assert escape("@channel @Here @everyone ops@example.com @channels") == (
        "＠channel ＠Here ＠everyone ops@example.com @channels"
    )


def test_a_value_cannot_leave_its_code_span() -> None:
    assert code("gpu`<!here>`\n01") == "`gpuˋ&lt;!here&gt;ˋ 01`"


@pytest.mark.parametrize(
    "url",
    [
        "javascript:alert(1)",
        "http://runbooks.example.com/x",  # outside links are https only
        "https://evil.example|Approve",
        "https://evil.example><!channel",
        "https://evil.example/\u202egnp",
        "https://evil.example/a b",
        "https:///no-host",
        "data:text/html,hi",
        "//evil.example/x",
        "",
    ],
)
def test_links_refused(url: str) -> None:
    assert link(url, "runbook") is None


def test_an_https_link_is_made_with_its_label_escaped() -> None:
    got = link("https://runbooks.example.com/xid?a=1&b=2#対処", "<!here> runbook")
    assert got == "<https://runbooks.example.com/xid?a=1&amp;b=2#対処|&lt;!here&gt; runbook>"
    assert link("http://temporal.test:8233/x", "UI", schemes=WEB) == (
        "<http://temporal.test:8233/x|UI>"
    )
    assert HTTPS == {"https"}


def test_only_well_formed_slack_ids_are_mentioned() -> None:
    assert user("U0123ABCD") == "<@U0123ABCD>"
    assert user("U_ALICE") == "<@U_ALICE>"  # the sandbox's ids
    assert user("U1|x><!channel") == "U1|x&gt;&lt;!channel"
    assert user("<!here>") == "&lt;!here&gt;"
    assert group_mention("S0PAGERS") == "<!subteam^S0PAGERS>"
    assert group_mention("S1><!channel") == "" and group_mention(None) == ""


def test_text_objects_are_verbatim_cut_and_never_empty() -> None:
    obj = text_object(escape("A" * 5000))
    assert obj["type"] == "mrkdwn" and obj["verbatim"] is True
    assert len(obj["text"]) == 3000 and obj["text"].endswith("…")
    assert text_object(Mrkdwn(""))["text"] == "-"
    head = plain_object("x\n" * 200, MAX_HEADER)
    assert head["type"] == "plain_text" and len(head["text"]) <= MAX_HEADER
    assert "\n" not in head["text"]


def test_a_forgotten_escape_fails_safe() -> None:
    """A plain str where Mrkdwn belongs (a type error) is escaped, not sent as markup."""
    assert message_text("<!channel>") == "&lt;!channel&gt;"  # type: ignore[arg-type]
    assert text_object("<!here>")["text"] == "&lt;!here&gt;"  # type: ignore[arg-type]
    assert join(["<!here>", Mrkdwn("<@U1>")], " ") == "&lt;!here&gt; <@U1>"
    assert len(message_text(escape("x" * 100_000))) == 4000
