"""Why a daemon did not come up: its log's last lines, and who holds a port it could not
bind (the usual cause on a shared machine)."""

from __future__ import annotations

from autoclusters.sandbox.runtime import port_holders
from autoclusters.sandbox.runtime.daemons import SandboxError
from autoclusters.sandbox.runtime.processes import ProcessTable


def daemon_failed(table: ProcessTable, name: str, why: str) -> SandboxError:
    tail = table.log_tail(name)
    held = port_holders.explain(tail)  # a port it could not bind: who has it now
    return SandboxError(
        f"{why}; last lines of {table.log_dir / (name + '.out')}:\n{tail}"
        + (f"\n{held}" if held else "")
    )
