"""Record the replay histories of every workflow type for a release (docs/versioning.md).

    .venv/bin/python scripts/record-histories.py RELEASE [recorder ...]

Run it on the release's own code (the tag), from the repository root. Each recorder runs
its cases on the time-skipping test server against in-memory fakes and writes
tests/histories/<workflow>_<RELEASE>_<case>.json; tests/workers/test_replay.py replays every file
there. Recorders: remediation (NodeRemediation and FleetGuard), cluster
(ClusterProvisioning), cluster_ops (ScaleNodeSet, ClusterTeardown), sharing (GpuSharing), systemic
(SystemicIncident, a member's NodeRemediation, its FleetGuard).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDERS = {
    "remediation": "tests.histories.record",
    "cluster": "tests.histories.record_cluster",
    "cluster_ops": "tests.histories.record_cluster_ops",
    "sharing": "tests.histories.record_sharing",
    "systemic": "tests.histories.record_systemic",
}


def main(release: str, chosen: list[str]) -> int:
    unknown = [c for c in chosen if c not in RECORDERS]
    if unknown:
        print(f"unknown recorder(s) {unknown}; choose from {sorted(RECORDERS)}", file=sys.stderr)
        return 2
    for name in chosen or list(RECORDERS):
        print(f"--- {name}", flush=True)
        # One process each: every recorder starts and stops its own test server.
        done = subprocess.run([sys.executable, "-m", RECORDERS[name], release], cwd=ROOT)
        if done.returncode != 0:
            return done.returncode
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    # os._exit: the SDK's runtime can crash at interpreter exit (sdk-python#300).
    os._exit(main(sys.argv[1], sys.argv[2:]))
