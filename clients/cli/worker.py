"""`autoclusters worker`: host the workflows and activities on this machine until stopped."""

from __future__ import annotations

import asyncio
import logging
import sys

from autoclusters.clients.cli import connect


def worker() -> None:
    """Run a worker hosting the remediation workflow and its activities."""
    from autoclusters.workers.remediation import run

    s = connect.load_settings()
    logging.basicConfig(
        level=s.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stdout,
    )
    asyncio.run(run(s))
