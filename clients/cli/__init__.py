"""The `autoclusters` command line: one module per command group, assembled in app.py,
each reaching Temporal through connect.py.

This file imports none of them, so `python -m autoclusters.clients.cli.agent` on a GPU node
loads the agent's commands alone, without the Temporal SDK the other commands need.
"""

from __future__ import annotations


def main() -> None:
    """The `autoclusters` script (pyproject.toml's [project.scripts])."""
    from autoclusters.clients.cli.app import main as run

    run()
