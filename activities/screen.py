"""The burn-in screen: a repaired node proves itself under load before it returns.

One activity, each of its moves idempotent so a retry (a worker that died) resumes it:

1. the neighbour: the first healthy idle node Slurm shows (idle, no flag: not drained,
   reserved or down), read now, never assumed; none idle: the node is screened alone (an
   intra-node all-reduce) and the result says so;
2. the breakfix reservation `breakfix-<node>` on the node (and the neighbour), created when
   absent and read back, with a duration past the screen's bound (a lost delete expires);
3. the node is resumed inside it (a drained node runs no job, reservation or not; the
   reservation keeps every other job off it);
4. the screen job (`examples/training/screen.py` under srun: the agent's active diagnostic
   on each node, then the all-reduce), adopted by name on a retry, waited for while beating;
5. whatever the outcome: the node drained again under the incident's reason (read back),
   then the reservation deleted. The runbook's own return to service returns it.

A job that failed, a diagnostic that failed, an all-reduce or a node's GEMM rate missing
or below the policy's floor: not passed (the runbook treats it as a failed health gate).
Slurm not answering raises (the step waits the outage out); a node drained by someone else
raises, never resumed.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import shlex
import sys
import time
from pathlib import Path

from temporalio import activity
from temporalio.exceptions import ApplicationError

from autoclusters.activities.acceptance_job import JOB_ENDED
from autoclusters.activities.heartbeat import heartbeating
from autoclusters.activities.slurm import known_node
from autoclusters.core.models import ScreenInput, ScreenResult, SlurmNode
from autoclusters.integrations.slurm import SlurmError, SlurmUnavailable
from autoclusters.integrations.slurm_reservations import SlurmReservationCli

SCREEN_PY = Path(__file__).resolve().parent.parent / "examples" / "training" / "screen.py"
RELEASE_S = 60.0  # the screen job's end (COMPLETING, a cancel) before the reservation goes
_FIELD = re.compile(r"(\w+)=(\"(?:[^\"\\]|\\.)*\"|\S+)")


def reservation_name(node: str) -> str:
    return f"breakfix-{node}"


def job_name(key: str) -> str:
    return f"autoclusters-screen-{key}"


def healthy_idle(nodes: list[SlurmNode], but: str) -> str | None:
    """The neighbour: the first node (by name) that is idle with no state flag at all."""
    idle = [n.name for n in nodes if n.name != but and n.state == "idle" and not n.state_flags]
    return min(idle) if idle else None


def parse_output(text: str) -> tuple[dict[str, str] | None, dict[str, str]]:
    """The job's output: rank 0's `allreduce` line (its fields), and each node's `diag`
    line (node -> "pass" or what failed)."""
    allreduce: dict[str, str] | None = None
    diag: dict[str, str] = {}
    for line in text.splitlines():
        fields = {k: v for k, v in _FIELD.findall(line)}
        if line.startswith("allreduce "):
            allreduce = fields
        elif line.startswith("diag ") and "node" in fields:
            detail = fields.get("detail", '""')
            try:
                detail = json.loads(detail)
            except ValueError:
                pass
            diag[fields["node"]] = "pass" if fields.get("result") == "pass" else detail
    return allreduce, diag


def parse_gemm(text: str) -> dict[str, float]:
    """Each node's slowest rank's GEMM rate (TFLOP/s) from the ranks' `gemm` lines."""
    rates: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("gemm "):
            continue
        fields = {k: v for k, v in _FIELD.findall(line)}
        rate = _float(fields.get("tflops"))
        if "node" in fields and rate is not None:
            node = fields["node"]
            rates[node] = min(rate, rates.get(node, rate))
    return rates


def judge(
    inp: ScreenInput,
    *,
    nodes: list[str],
    job_state: str,
    output: str,
) -> ScreenResult:
    """The screen's verdict from the ended job's state and output (pure: tested alone)."""
    allreduce, diag = parse_output(output)
    failures: list[str] = []
    for n in nodes:
        if n not in diag:
            failures.append(f"no diagnostic from {n}")
        elif diag[n] != "pass":
            failures.append(f"diagnostic on {n}: {diag[n]}")
    res = ScreenResult(
        node=inp.node, passed=False, seconds=0, diag=diag, gemm_tflops=parse_gemm(output)
    )
    if inp.min_gemm_tflops:
        for n in nodes:
            rate = res.gemm_tflops.get(n)
            if rate is None:
                failures.append(f"no GEMM rate from {n}")
            elif rate < inp.min_gemm_tflops:
                failures.append(f"GEMM on {n} {rate:.1f} TFLOP/s < {inp.min_gemm_tflops:g}")
    if allreduce is None:
        failures.append("no all-reduce result")
    else:
        res.backend = allreduce.get("backend")
        res.allreduce_s = _float(allreduce.get("mean_s"))
        res.algbw_gbps = _float(allreduce.get("algbw_gbps"))
        res.busbw_gbps = _float(allreduce.get("busbw_gbps"))
        if allreduce.get("correct") != "1":
            failures.append("the all-reduce summed wrong")
        bus = res.busbw_gbps or 0.0
        if inp.min_bus_gbps and bus < inp.min_bus_gbps:
            failures.append(f"all-reduce bus bandwidth {bus:.1f} GB/s < {inp.min_bus_gbps:g}")
    if job_state != "COMPLETED" and not failures:
        failures.append(f"the screen job ended {job_state}")
    res.passed = not failures and job_state == "COMPLETED"
    res.detail = "; ".join(failures) if failures else "passed"
    return res


def _float(raw: str | None) -> float | None:
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None


class ScreenActivities:
    """`work_dir`: a directory every node sees (the job's output and its FileStore);
    `fake_dir`: the sandbox's fake-backend files (None: the GPUs' own diagnostic);
    `ranks_per_node`: tasks per node (None: 1 with a neighbour, 2 alone; GPU nodes: their
    GPU count)."""

    def __init__(
        self,
        slurm: SlurmReservationCli,
        work_dir: Path,
        *,
        fake_dir: Path | None = None,
        ranks_per_node: int | None = None,
        python: str = sys.executable,
    ) -> None:
        self._slurm = slurm
        self._work_dir = work_dir
        self._fake_dir = fake_dir
        self._ranks = ranks_per_node
        self._python = python

    @activity.defn(name="burn_in_screen")
    async def burn_in_screen(self, inp: ScreenInput) -> ScreenResult:
        async with heartbeating(f"burn_in_screen {inp.node}"):
            return await self.screen(inp)

    async def screen(self, inp: ScreenInput) -> ScreenResult:
        started = time.monotonic()
        slurm, name = self._slurm, reservation_name(inp.node)
        reasons = {inp.node: inp.drain_reason, **inp.others}
        drained: list[str] = []
        for screened, reason in reasons.items():
            node = await known_node(slurm, screened)
            # Ours: the incident's reason, or the Slinky operator's copy of it (its cordon
            # sync).
            ours = node.reason == reason or node.reason.endswith(f": {reason}")
            if node.drained and not ours:
                raise ApplicationError(
                    f"{screened} is drained by someone else ({node.reason!r}): not screened",
                    type="NotOurs",
                    non_retryable=True,
                )
            if node.drained:
                drained.append(screened)
        held = await slurm.reservation(name)
        if held is None:
            neighbour = None
            if inp.neighbour and not inp.others:
                neighbour = healthy_idle(await slurm.nodes(), inp.node)
            nodes = [*reasons, *([neighbour] if neighbour else [])]
            await slurm.create_reservation(name, nodes, getpass.getuser(), inp.timeout_s + 300)
            held = await slurm.reservation(name)
            if held is None:
                raise SlurmUnavailable(f"reservation {name} did not show when read back")
        nodes = sorted(_expand(held.get("Nodes", inp.node)))
        neighbour = next((n for n in nodes if n not in reasons), None)
        job_id: int | None = None
        state, output = "not submitted", ""
        try:
            for screened in drained:
                await slurm.resume(screened)
            job_id = await self._submit(inp, name, nodes)
            state, output = await self._wait(inp, job_id)
        finally:
            # Never leave a node undrained outside a runbook step: drained under its
            # incident's reason again before the reservation goes.
            for screened, reason in reasons.items():
                await slurm.drain(screened, reason)
                back = await known_node(slurm, screened)
                if not back.drained:
                    raise SlurmUnavailable(f"the drain of {screened} did not show when read back")
            kept = await self._release(name, job_id, inp.poll_s)
        res = judge(inp, nodes=nodes, job_state=state, output=output)
        if kept:
            res.detail += f"; {kept}"
        res.seconds = round(time.monotonic() - started, 3)
        res.reservation, res.job_id, res.neighbour = name, job_id, neighbour
        if neighbour is None and not inp.others:
            res.detail += "; no healthy idle neighbour: screened alone"
        return res

    async def _submit(self, inp: ScreenInput, reservation: str, nodes: list[str]) -> int:
        """The screen job, submitted once: a retry adopts the job of the same name."""
        slurm, jname = self._slurm, job_name(inp.key)
        self._work_dir.mkdir(parents=True, exist_ok=True)
        mine = [j for j in await slurm.jobs() if j.name == jname]
        if mine:
            return max(j.job_id for j in mine)
        ranks = self._ranks or (1 if len(nodes) > 1 else 2)
        argv = [
            "srun", self._python, str(SCREEN_PY), "--store", str(self._work_dir),
            "--size-mib", str(inp.size_mib), "--rounds", str(inp.rounds),
        ]  # fmt: skip
        if self._fake_dir is not None:
            argv += ["--fake-dir", str(self._fake_dir)]
        return await slurm.submit_in_reservation(
            shlex.join(argv),
            name=jname,
            reservation=reservation,
            nodes=nodes,
            ntasks_per_node=ranks,
            output=str(self._output(inp)),
            time_limit_s=inp.timeout_s,
            comment=f"autoclusters burn-in screen of {inp.node} ({inp.incident_id})",
        )

    def _output(self, inp: ScreenInput) -> Path:
        return self._work_dir / f"{job_name(inp.key)}.out"

    async def _wait(self, inp: ScreenInput, job_id: int) -> tuple[str, str]:
        """The job's end state and output; cancelled (and failed) past the screen's bound."""
        deadline = time.monotonic() + inp.timeout_s
        while True:
            job = await self._slurm.job(job_id)
            if job is None:
                raise SlurmUnavailable(f"screen job {job_id} is no longer known to slurmctld")
            if job.job_state in JOB_ENDED:
                break
            if time.monotonic() >= deadline:
                await self._slurm.cancel(job_id)
                return f"not ended within {inp.timeout_s:.0f}s (cancelled)", ""
            await asyncio.sleep(inp.poll_s)
        out = self._output(inp)
        return job.job_state, out.read_text(errors="replace") if out.exists() else ""

    async def _release(self, name: str, job_id: int | None, poll_s: float) -> str:
        """Delete the reservation once no job of ours runs in it (Slurm refuses "in use"
        while one does, COMPLETING included). "" when gone; else why it stays: it then
        ends by its own duration, and the node is drained meanwhile."""
        slurm = self._slurm
        deadline = time.monotonic() + RELEASE_S
        while True:
            if await slurm.reservation(name) is None:
                return ""
            job = await slurm.job(job_id) if job_id is not None else None
            if job is not None and job.job_state not in JOB_ENDED:
                await slurm.cancel(job.job_id)  # a screen given up on: nothing runs there
            else:
                try:
                    await slurm.delete_reservation(name)
                    return ""
                except SlurmError as e:
                    if "in use" not in str(e).lower():
                        raise
            if time.monotonic() >= deadline:
                return f"reservation {name} still in use after {RELEASE_S:.0f}s: it ends by itself"
            await asyncio.sleep(poll_s)


def _expand(nodes: str) -> list[str]:
    from autoclusters.core import hostlist

    return hostlist.expand(nodes)
