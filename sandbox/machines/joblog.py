"""Reading a training job's own log: `key=value` progress lines such as

    ts=1795983517.03 node=gpu-01 restart=0 rank=0 step=12 resumed_from=0 loss=0.41

The job's log is the truth about when it was stepping, so recovery is measured from it.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel

_PAIR = re.compile(r"(\w+)=(\S+)")


class ProgressLine(BaseModel):
    ts: float
    node: str
    restart: int
    step: int
    resumed_from: int | None = None
    elastic: int = 0  # in-job mode: the group's generation (a re-forming without a lost node)


def parse(line: str) -> ProgressLine | None:
    fields = dict(_PAIR.findall(line))
    if not {"ts", "restart", "step"} <= fields.keys():
        return None
    try:
        return ProgressLine(
            ts=float(fields["ts"]),
            node=fields.get("node", ""),
            restart=int(fields["restart"]),
            step=int(fields["step"]),
            resumed_from=int(fields["resumed_from"]) if "resumed_from" in fields else None,
            elastic=int(fields.get("elastic", 0)),
        )
    except ValueError:
        return None


def progress_lines(log: Path) -> list[ProgressLine]:
    if not log.exists():
        return []
    return [p for line in log.read_text(errors="replace").splitlines() if (p := parse(line))]


def first_progress_after_restart(log: Path, restart: int) -> float | None:
    """Timestamp of the first progress line the `restart`-th run of the job wrote."""
    return next((p.ts for p in progress_lines(log) if p.restart >= restart), None)


def first_progress_after_reforming(log: Path, after_ts: float) -> ProgressLine | None:
    """In-job mode: the first step line of a later generation than the job's first, written
    after `after_ts` (the group re-formed without a node)."""
    return next((p for p in progress_lines(log) if p.elastic > 0 and p.ts >= after_ts), None)


def training_nodes(log: Path, from_step: int = 1) -> set[str]:
    """In-job mode: the nodes the job's first run trains on (the standby logs no step until
    it takes a seat), once they reached `from_step`."""
    return {
        p.node
        for p in progress_lines(log)
        if p.restart == 0 and p.elastic == 0 and p.step >= from_step
    }


def went_on_from(log: Path, restart: int) -> int | None:
    """The step the `restart`-th run of the job went on from (its first progress line's
    `resumed_from`); None for the first run, or a job that does not log it."""
    if restart < 1:
        return None
    return next(
        (
            p.resumed_from
            for p in progress_lines(log)
            if p.restart == restart and p.resumed_from is not None
        ),
        None,
    )


def event_at(log: Path, event: str, restart: int) -> float | None:
    """When the `restart`-th run of the job first logged `event=<event>`: `launch` (the
    batch script started), `resumed` (its ranks loaded their checkpoint), ...; None if it
    has not (yet), or the log is unreadable."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        fields = dict(_PAIR.findall(line))
        if fields.get("event") != event or "ts" not in fields:
            continue
        try:
            if int(fields.get("restart", "0")) == restart:
                return float(fields["ts"])
        except ValueError:
            continue
    return None
