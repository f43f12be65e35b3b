"""Capture what Slurm's commands print while slurmctld is down, for the reader tests
(tests/data/slurm-22.05-controller-down/).

    .venv/bin/python scripts/capture-slurm-outage.py STATE_DIR OUT_DIR

against a running sandbox (`autoclusters sandbox up --state-dir STATE_DIR`): a job is
submitted, slurmctld is stopped by its recorded PID and started again by the sandbox's own
restart, and each command's stdout, stderr and exit status are written while it is down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from autoclusters.sandbox import cluster, restart


def main(state: Path, out: Path) -> None:
    cfg = cluster.load(state)
    env = dict(os.environ, SLURM_CONF=str(cfg.slurm_conf))

    def run(name: str, *argv: str) -> None:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        (out / f"{name}.stdout").write_text(p.stdout)
        (out / f"{name}.stderr").write_text(p.stderr)
        (out / f"{name}.rc").write_text(f"{p.returncode}\n")
        print(name, p.returncode, p.stderr.strip())

    submit = ["sbatch", "--parsable", "--no-requeue", "-N1", "-p", "gpu", "--wrap", "sleep 300"]
    job = subprocess.run(submit, env=env, capture_output=True, text=True).stdout.strip()
    time.sleep(3)  # a one-off capture: let the job start
    run("sinfo-up", "sinfo", "--json")
    run("squeue-up", "squeue", "--json")

    def while_down() -> None:
        run("sinfo", "sinfo", "--json")
        run("squeue", "squeue", "--json")
        run("scontrol-update-drain", "scontrol", "update", "NodeName=gpu-01", "State=DRAIN",
            "Reason=capture")  # fmt: skip
        run("scontrol-requeue", "scontrol", "requeue", job)
        run("scancel", "scancel", job)
        run("scontrol-update-job", "scontrol", "update", f"JobId={job}", "StartTime=now")

    restart.restart(cfg, "slurmctld", between=while_down)
    subprocess.run(["scancel", job], env=env, check=False)


if __name__ == "__main__":
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    main(Path(sys.argv[1]), out)
