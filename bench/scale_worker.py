"""The scale benchmark's worker: `autoclusters worker` (workers/remediation.run: our
workflows, activities, metrics, settings from AUTOCLUSTERS_*), with Slurm and the cloud
replaced by the stand-in cluster at URL (sandbox/standin/server.py).

    python bench/scale_worker.py http://127.0.0.1:PORT
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoclusters.core.settings import load  # noqa: E402
from autoclusters.sandbox.standin.clients import StandInCloud, StandInSlurm  # noqa: E402
from autoclusters.workers.remediation import run  # noqa: E402


def main() -> None:
    url = sys.argv[1]
    settings = load()
    logging.basicConfig(
        level=settings.log_level,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stdout,
    )
    asyncio.run(run(settings, slurm=StandInSlurm(url), cloud=StandInCloud(url)))
    sys.stdout.flush()
    os._exit(0)  # Temporal's Rust threads can crash a normal interpreter exit (sdk#300)


if __name__ == "__main__":
    main()
