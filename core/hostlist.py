"""Slurm hostlist expressions (`gpu-[01-03,07]`) expanded to node names.

`squeue --json` ignores its filters, so jobs are matched to nodes here.
"""

from __future__ import annotations

import re

_BRACKET = re.compile(r"\[([^\]]*)\]")


def _split_top_level(expr: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return parts


def _expand_one(item: str) -> list[str]:
    m = _BRACKET.search(item)
    if not m:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    names: list[str] = []
    for rng in m.group(1).split(","):
        lo, _, hi = rng.partition("-")
        if not hi:
            names.append(lo)
            continue
        width = len(lo)
        names.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return [n for name in names for n in _expand_one(head + name + tail)]


def expand(expr: str) -> list[str]:
    """`gpu-[01-02],cpu-1` -> ['gpu-01', 'gpu-02', 'cpu-1']."""
    return [n for item in _split_top_level(expr.strip()) if item for n in _expand_one(item)]
