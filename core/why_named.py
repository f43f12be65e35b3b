"""Why the agent named this node for a silent fault, in a few lines for people.

A JOB_HANG or SLOW_NODE comes with the agent's subjects (clients/agent/progress_rules.py):
the rule that named the rank or node, its figures, and for a hang the ranks' Python
stacks grouped (clients/agent/stacks.py). The incident's opening message (and so the Slack
card and the Temporal UI) carries these lines, so whoever reads it sees why this node, not
only that it was named. Pure and bounded: the workflow builds it from its own state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MAX_LINES = 6
MAX_FRAMES_SHOWN = 3  # the innermost: where the rank waits


def _n(v: Any) -> str:
    """A figure as the agent gave it: a number without trailing zeros, else '?'."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return "?"
    return f"{v:g}"


def _hang(s: Mapping[str, Any]) -> list[str]:
    raw = s.get("others")
    others: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    inside = "inside" if s.get("in_collective") else "outside"
    lines = [
        f"Why this node: job {s.get('job')} rank {s.get('rank')} (pid {s.get('pid')}), rule "
        f"{s.get('rule')}: no step for {_n(s.get('stalled_s'))} s, threshold "
        f"{_n(s.get('threshold_s'))} s (step-time tail {_n(s.get('step_tail_s'))} s); "
        f"{inside} the collective at step {s.get('step')}, heartbeat "
        f"{_n(s.get('heartbeat_age_s'))} s old; the other {_n(others.get('ranks'))} ranks: "
        f"{_n(others.get('in_collective'))} inside, newest step {others.get('max_step')}, "
        f"freshest heartbeat {_n(others.get('heartbeat_age_s'))} s"
    ]
    stacks = s.get("stacks")
    if isinstance(stacks, Mapping):
        lines.append(_stacks(stacks))
    return lines


def _stacks(st: Mapping[str, Any]) -> str:
    if "groups" not in st:
        return f"Stacks: {st.get('detail', 'none')}"
    groups = [g for g in st.get("groups") or [] if isinstance(g, Mapping)]
    outlier = st.get("outlier_ranks")
    parts = []
    for g in groups:
        frames = " < ".join(str(f) for f in (g.get("frames") or [])[:MAX_FRAMES_SHOWN])
        mark = " (outlier)" if outlier is not None and g.get("ranks") == outlier else ""
        parts.append(f"ranks {g.get('ranks')}{mark}: {frames or 'no Python frame'}")
    failed = st.get("failed") or {}
    tail = f"; no dump of ranks {sorted(failed)}" if failed else ""
    return f"Stacks ({len(groups)} groups, py-spy): " + "; ".join(parts) + tail


def _slow(s: Mapping[str, Any]) -> list[str]:
    steps = s.get("steps") or []
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "its last steps"
    mine, theirs = s.get("node_busy_s") or [], s.get("peers_busy_s") or []
    busy = f"; last busy {_n(mine[-1])} s vs {_n(theirs[-1])} s" if mine and theirs else ""
    return [
        f"Why this node: job {s.get('job')} ranks {s.get('ranks')}, rule {s.get('rule')}: "
        f"{_n(s.get('ratio'))}x the other nodes' median busy time per step (>= "
        f"{_n(s.get('slow_ratio'))}) on each of {span}{busy}"
    ]


def why_named(fault: str, readings: Mapping[str, Any]) -> str:
    """The lines for `fault`'s evidence (its agent readings); "" for another fault."""
    if fault not in ("JOB_HANG", "SLOW_NODE"):
        return ""
    subjects = readings.get("subjects")
    lines: list[str] = []
    for s in subjects if isinstance(subjects, list) else []:
        if isinstance(s, Mapping):
            lines += _hang(s) if fault == "JOB_HANG" else _slow(s)
    return "\n".join(lines[:MAX_LINES])
