"""The README stays a five-minute read and the docs stay connected (issue 20, item 5):

- the README says what a newcomer needs in at most 150 lines before its first link out;
- every relative link in README.md and docs/*.md names a file that exists, and an anchor
  in a Markdown file names one of its headings (as GitHub makes them);
- the README's two commands are `make demo` then `make test`, and both are Makefile targets.

Reads files only: no server, no network.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_LINES_BEFORE_FIRST_LINK = 150

# [text](target) and ![alt](target), the target up to whitespace or ")"; <scheme://...>;
# and reference definitions "[name]: target".
INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTOLINK = re.compile(r"<([a-z][a-z0-9+.-]*:[^>\s]+)>", re.IGNORECASE)
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
FENCE = re.compile(r"^\s{0,3}(```|~~~)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


@dataclass(frozen=True)
class Link:
    doc: Path
    line: int  # 1-based
    target: str


def _prose_lines(path: Path, keep_code: bool = False) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced code blocks: a path in a code block
    is an example, not a link. Inline code spans are blanked for the same reason, unless
    `keep_code` (a heading's `code` is part of its anchor)."""
    out: list[tuple[int, str]] = []
    fence: str | None = None
    for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        m = FENCE.match(text)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            continue
        if fence is None:
            out.append((n, text if keep_code else re.sub(r"`[^`]*`", "``", text)))
    return out


def links(path: Path) -> list[Link]:
    found: list[Link] = []
    for n, text in _prose_lines(path):
        targets = [m.group(1) for m in INLINE_LINK.finditer(text)]
        targets += [m.group(1) for m in AUTOLINK.finditer(text)]
        ref = REFERENCE.match(text)
        if ref:
            targets.append(ref.group(1))
        found += [Link(path, n, t) for t in targets]
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower case, punctuation dropped
    (letters, digits, '_' and '-' stay), each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, text in _prose_lines(path, keep_code=True):
        m = HEADING.match(text)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        out.add(base if k == 0 else f"{base}-{k}")
    return out


def test_readme_is_short_before_its_first_link_out() -> None:
    outward = [lk for lk in links(README) if not lk.target.startswith("#")]
    assert outward, "the README links to nothing: where does a newcomer go next?"
    before = outward[0].line - 1
    assert before <= MAX_LINES_BEFORE_FIRST_LINK, (
        f"README.md has {before} lines before its first link out ({outward[0].target}, "
        f"line {outward[0].line}); at most {MAX_LINES_BEFORE_FIRST_LINK}: move detail to docs/"
    )


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc: Path) -> None:
    broken: list[str] = []
    for lk in links(doc):
        if EXTERNAL.match(lk.target) or not lk.target:
            continue
        file_part, _, anchor = lk.target.partition("#")
        target = (doc.parent / unquote(file_part)).resolve() if file_part else doc
        where = f"{doc.relative_to(ROOT)}:{lk.line}: {lk.target}"
        if not target.exists():
            broken.append(f"{where}: no such file")
        elif not target.is_relative_to(ROOT):
            broken.append(f"{where}: outside the repository")
        elif anchor and target.suffix == ".md" and unquote(anchor) not in anchors(target):
            broken.append(f"{where}: no heading with that anchor")
    assert broken == []


def test_links_are_found(tmp_path: Path) -> None:
    # The checks above are only as good as the link finder: it must see what GitHub sees.
    sample = tmp_path / "sample.md"
    sample.write_text(
        "# A `code` heading (here)\n"
        'See [a](docs/a.md#x-y), ![b](b.png "t") and <https://example.com/c>.\n'
        "```\n[not](in-a-fence.md)\n```\n"
        "`[not](in-code.md)`\n"
        "[ref]: ../d.md\n",
        encoding="utf-8",
    )
    assert [(lk.line, lk.target) for lk in links(sample)] == [
        (2, "docs/a.md#x-y"),
        (2, "b.png"),
        (2, "https://example.com/c"),
        (7, "../d.md"),
    ]
    assert anchors(sample) == {"a-code-heading-here"}


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.%/$()-][^:=\s]*(?:\s+[^:=\s]+)*)\s*::?(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def test_the_readmes_two_commands_are_make_demo_then_make_test() -> None:
    text = README.read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)
    assert len(section) == 2, "README.md has no '## The two commands' section"
    block = re.search(r"```[a-z]*\n(.*?)```", section[1], re.DOTALL)
    assert block, "the two commands are not in a code block"
    commands = re.findall(r"^make\s+(\S+)", block.group(1), re.MULTILINE)
    assert commands == ["demo", "test"]
    missing = set(commands) - make_targets()
    assert not missing, f"README.md names make targets the Makefile lacks: {sorted(missing)}"
