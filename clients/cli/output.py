"""Where every command writes: results to stdout (`console`), the rest to stderr (`err`), so a
script reading a command's output gets only the result."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autoclusters.core.models import StepRecord

console = Console()
err = Console(stderr=True)


def steps_table(steps: list[StepRecord]) -> Table:
    """A workflow's timeline as `incident show` prints it (a node's incident, a systemic one)."""
    t = Table("step", "outcome", "started", "finished", "seconds", "detail")
    for st in steps:
        secs = (st.finished_at - st.started_at).total_seconds() if st.finished_at else None
        t.add_row(
            st.name, st.outcome, f"{st.started_at:%H:%M:%S.%f}"[:-3],
            f"{st.finished_at:%H:%M:%S.%f}"[:-3] if st.finished_at else "",
            f"{secs:.2f}" if secs is not None else "", st.detail,
        )  # fmt: skip
    return t
