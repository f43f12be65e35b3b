"""The job the demo and the recovery benchmark run: the fault-tolerant torchrun job of
`examples/training` when PyTorch is installed (the `training` extra), otherwise the
stand-in that only logs progress."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from autoclusters import sandbox
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.config import SandboxConfig

REPO = Path(__file__).resolve().parent.parent
TRAINING = REPO / "examples" / "training"


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


async def submit(
    slurm: SlurmCli, cfg: SandboxConfig, name: str = "job", sbatch_args: tuple[str, ...] = ()
) -> tuple[int, Path, str]:
    """Submit the job; return its id, its log file and what it is ("torchrun" or "stand-in").
    `sbatch_args` override the script's #SBATCH lines (e.g. `--nodes=2-3`)."""
    jobs = cfg.state_dir / "jobs"
    jobs.mkdir(parents=True, exist_ok=True)
    if torch_available() and (TRAINING / "train.sbatch").exists():
        torchrun = Path(sys.executable).parent / "torchrun"
        export = ",".join(
            [
                "ALL",
                f"TORCHRUN={torchrun}",
                f"TRAIN_PY={TRAINING / 'train.py'}",
                f"CKPT_ROOT={jobs / 'ckpt'}",
                "STEP_SLEEP=1",
                "CKPT_EVERY=5",
            ]
        )
        script, kind, argv = TRAINING / "train.sbatch", "torchrun", [f"--export={export}"]
    else:
        script, kind, argv = Path(sandbox.__file__).parent / "jobs" / "progress.sh", "stand-in", []
    out = await slurm._run(  # noqa: SLF001 - sbatch is the demo's, not an activity's
        "sbatch", "--parsable", f"--output={jobs}/{name}-%j.log", f"--chdir={REPO}", *argv,
        *sbatch_args,
        str(script),
    )  # fmt: skip
    job_id = int(out.strip().split(";")[0])
    return job_id, jobs / f"{name}-{job_id}.log", kind
