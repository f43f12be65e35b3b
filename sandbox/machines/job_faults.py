"""Silent faults: a training rank that hangs or slows down with nothing wrong in what the
node's agent reads of its hardware (no Xid, no counter, no port down). Only the job's own
progress shows it (core/job_progress.py, the agent's JOB_HANG and SLOW_NODE).

`sandbox job-fault --node N --effect hang|slow [--factor K] [--job ID]` does to the job's
rank processes on the node what sandbox/machines/fault_effects.py does for a hardware fault, and
nothing else (no Hardware record, nothing in the agent's fake backend: the health gate
passes):

- `hang`: the ranks stop (SIGSTOP) with their connections silenced (nftables), so their
  peers wait in their next collective, as behind a rank wedged in its data loader or its
  driver;
- `slow`: a SIGSTOP/SIGCONT duty cycle, each step about `factor` times longer (2: the
  issue's 2x straggler).

How it is lifted. A hang like this is often software: the fault is in the processes, not
the machine. So it ends when they are gone: the job lets them go (Slurm ends a step's
processes when the runbook takes the node from the job, requeues or cancels it), and then
a watcher (`release-<node>` in the sandbox's ProcessTable) removes the node's nftables
chains at once, so that no later connection that gets one of those pairs of ports (the
burn-in screen's, the next job's) is silenced. It also ends, as every effect does, when the
machine is rebooted or replaced (fault_effects.lift: any repair rung power-cycles the
sandbox's VM) and at `sandbox down`. A slowdown ends with its processes (the duty cycle
stops when none is left) or at the same repair.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Literal, get_args

from autoclusters.core.process_start import start_ticks
from autoclusters.sandbox.machines import fault_effects
from autoclusters.sandbox.machines.fault_effects import NodeEffect, Proc
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable

JobEffect = Literal["hang", "slow"]
JOB_EFFECTS: tuple[str, ...] = get_args(JobEffect)
DEFAULT_FACTOR = 2.0  # the straggler: steps twice as long
MAX_FACTOR = 20.0
RELEASE_POLL_S = 0.5


def parse_job_effect(value: str) -> JobEffect:
    if value not in JOB_EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(JOB_EFFECTS)}, not {value!r}")
    return value  # type: ignore[return-value]


def parse_factor(value: float) -> float:
    """`--factor`: how many times longer a step takes under `slow`, in (1, MAX_FACTOR]."""
    if not 1.0 < value <= MAX_FACTOR:
        raise ValueError(f"factor must be above 1 and at most {MAX_FACTOR:g}, not {value:g}")
    return value


def inject(
    cfg: SandboxConfig,
    node: str,
    effect: JobEffect,
    *,
    factor: float = DEFAULT_FACTOR,
    job_id: int | None = None,
) -> NodeEffect:
    """The silent fault on the job's ranks on `node` (every job's, or `job_id`'s); returns
    what was done. Raises LookupError when no rank of a job runs there."""
    if not fault_effects.rank_processes(cfg, node, job_id):
        which = f"job {job_id}" if job_id is not None else "a job"
        raise LookupError(f"no rank of {which} runs on {node}")
    done = fault_effects.apply(cfg, node, effect, job_id=job_id, factor=parse_factor(factor))
    if effect == "hang" and done.stopped:
        table = ProcessTable(cfg.state_dir)
        table.stop(fault_effects.release_name(node))  # an earlier hang's watcher, if any
        procs = [f"{p.pid}:{p.ticks}" for p in done.stopped]
        argv = [sys.executable, "-m", "autoclusters.sandbox.machines.job_faults", "release",
                str(cfg.state_dir), node, *procs]  # fmt: skip
        table.spawn(fault_effects.release_name(node), argv)
    return done


def alive(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if start_ticks(p.pid) == p.ticks]


def _recorded_stopped(cfg: SandboxConfig, node: str) -> list[Proc]:
    """What the node's record holds stopped (a later fault on the machine may add to it)."""
    rec = fault_effects.recorded(cfg, node)
    return rec.stopped if rec is not None else []


def release_when_gone(cfg: SandboxConfig, node: str, procs: list[Proc]) -> bool:
    """Wait until every one of `procs` (and whatever else the node's record holds stopped)
    has ended, then lift the node's silence (its chains,
    its record). False: stopped (SIGTERM) first, nothing lifted (the repair's power-off
    does it)."""
    stopped = False

    def stop(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopped and (alive(procs) or alive(_recorded_stopped(cfg, node))):
        time.sleep(RELEASE_POLL_S)
    if stopped:
        return False
    fault_effects.unsilence(cfg, node)
    return True


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "release":
        cfg = SandboxConfig.load(Path(argv[1]))
        procs = []
        for item in argv[3:]:
            pid, _, ticks = item.partition(":")
            procs.append(Proc(pid=int(pid), ticks=int(ticks)))
        released = release_when_gone(cfg, argv[2], procs)
        print(f"{argv[2]}: {'released' if released else 'stopped before its processes ended'}")
        return 0
    print(
        "usage: python -m autoclusters.sandbox.machines.job_faults"
        " release STATE_DIR NODE PID:TICKS..."
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
