"""The job the demo and the recovery benchmark run: the fault-tolerant torchrun job of
`examples/training` when PyTorch is installed (the `training` extra), otherwise the
stand-in that only logs progress."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.runtime.config import JOB_PORTS, SandboxConfig

REPO = Path(__file__).resolve().parents[2]
TRAINING = REPO / "examples" / "training"
# The stand-in job (no PyTorch): progress lines only.
PROGRESS_JOB = Path(__file__).resolve().with_name("jobs") / "progress.sh"

# Steps between the job's checkpoints (train.sbatch CKPT_EVERY).
CKPT_EVERY = 5
# Re-formings a job with standbys from holders may make before it gives up (MAX_RESTARTS):
# each fault is one, and the pool refills.
HOLDER_RESTARTS = 1000


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


async def submit(
    slurm: SlurmCli,
    cfg: SandboxConfig,
    name: str = "job",
    sbatch_args: tuple[str, ...] = (),
    *,
    in_job: bool = False,
    stand_in: bool = False,
    train_args: tuple[str, ...] = (),
    holders: bool = False,
) -> tuple[int, Path, str]:
    """Submit the job; return its id, its log file and what it is ("torchrun", "in-job" or
    "stand-in"). `sbatch_args` override the script's #SBATCH lines (e.g. `--nodes=2-3`).
    `in_job`: the example's in-job mode, 2 nodes training and a standby in the allocation
    (`SPARES=1 --nodes=3 --no-kill`), where the runbook recovers it without a requeue; the
    stand-in has no such mode. `stand_in`: the stand-in even where torch is installed (a demo
    whose point is not the training job: observe mode). `train_args`: train.py's own
    options (after the script; not for the stand-in). `holders` (with `in_job`): the layout
    of standbys held outside the job (core/holders.py): a batch host that never trains
    (`LAUNCHER=1`) beside the 2 training nodes and the standby (`--nodes=4`), and standbys
    taken from holder jobs once its own is used (`HOLDERS=1`; the policy's
    `standby_holders` gives them), re-forming as often as faults come."""
    jobs = cfg.state_dir / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    if not stand_in and torch_available() and (TRAINING / "train.sbatch").exists():
        torchrun = Path(sys.executable).parent / "torchrun"
        env = [
            "ALL",
            f"TORCHRUN={torchrun}",
            f"TRAIN_PY={TRAINING / 'train.py'}",
            f"CKPT_ROOT={jobs / 'ckpt'}",
            "STEP_SLEEP=1",
            f"CKPT_EVERY={CKPT_EVERY}",
            f"RDZV_PORT_BASE={cfg.job_port_base}",
            f"RDZV_PORTS={JOB_PORTS}",
            # Each rank's progress, for the nodes' agents (their progress_dir, daemons.py).
            f"AUTOCLUSTERS_PROGRESS_DIR={cfg.progress_dir}",
        ]
        kind = "torchrun"
        if in_job:
            # The sandbox's nodes share this host: the "node-local" PID folder is the job's.
            env += ["SPARES=1", f"INJOB_DIR={jobs / f'injob-{name}'}"]
            sbatch_args = ("--nodes=3", "--no-kill", *sbatch_args)
            kind = "in-job"
            if holders:
                env += ["LAUNCHER=1", "HOLDERS=1", f"MAX_RESTARTS={HOLDER_RESTARTS}"]
                sbatch_args = ("--nodes=4", *sbatch_args[1:])
                kind = "in-job+holders"
        script, argv = TRAINING / "train.sbatch", [f"--export={','.join(env)}"]
    else:
        script, kind, argv = PROGRESS_JOB, "stand-in", []
        train_args = ()
    out = await slurm._run(  # noqa: SLF001 - sbatch is the demo's, not an activity's
        "sbatch", "--parsable", f"--output={jobs}/{name}-%j.log", f"--chdir={REPO}", *argv,
        *sbatch_args,
        str(script),
        *train_args,
    )  # fmt: skip
    job_id = int(out.strip().split(";")[0])
    return job_id, jobs / f"{name}-{job_id}.log", kind
