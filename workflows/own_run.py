"""A command only on the run that issues it.

A worker that stops with runs open in its cache does not evict them (sdk-core evicts no
idle run at shutdown): their coroutines are left to the garbage collector, which closes
each by throwing GeneratorExit into it, in whatever thread collects it (sdk-python#494).
The `finally` blocks and clean-ups on the way out then run there, and a command they issue
goes to the workflow loop current in that thread: another run's, whose history then departs
from its code (a nondeterminism error on its next replay), or none.

So the kernel's command points, through which the runbook's clean-ups issue theirs (an
activity: `Steps.call`; a search-attribute upsert: `Incident.publish`), check that the
loop is their own run's before they issue one: elsewhere, the coroutine is being closed,
and they end it. tests/workflows/test_dropped_run_commands.py drops runs and collects
them inside another.
"""

from __future__ import annotations

from temporalio import workflow


class OwnRun:
    """The run this object was made in (made in workflow code: its `__init__` or run)."""

    def __init__(self) -> None:
        self.run_id = workflow.info().run_id

    def check(self) -> None:
        """Raise GeneratorExit unless this run's loop is current: the only way to get here
        on another loop (or none) is a coroutine of a dropped run being closed, and what it
        was about to issue belongs to nobody."""
        if not workflow.in_workflow() or workflow.info().run_id != self.run_id:
            raise GeneratorExit("a dropped run's coroutine is closing: no command")
