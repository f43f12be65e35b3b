"""Talking to Slurm.

`SlurmClient` is the small interface the activities need; `SlurmCli` implements it with
the Slurm commands and their `--json` output. A slurmrestd implementation can sit beside
it later without touching the activities.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from autoclusters.core import hostlist
from autoclusters.core.models import SlurmJob, SlurmNode

RESTART_GRACE_S = 2


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries the command and what Slurm said."""


class UnknownNodeError(SlurmError):
    pass


class SlurmClient(Protocol):
    async def nodes(self) -> list[SlurmNode]: ...
    async def node(self, name: str) -> SlurmNode | None: ...
    async def jobs(self) -> list[SlurmJob]: ...
    async def jobs_on_node(self, name: str) -> list[SlurmJob]: ...
    async def drain(self, node: str, reason: str) -> None: ...
    async def resume(self, node: str) -> None: ...
    async def requeue(self, job_id: int) -> None: ...
    async def release_hold(self, job_id: int) -> None: ...
    async def set_admin_comment(self, job_id: int, text: str) -> None: ...
    async def cancel(self, job_id: int) -> None: ...


class SlurmBatchClient(SlurmClient, Protocol):
    """What cluster provisioning adds: submit a batch job and follow it by id."""

    async def submit_batch(
        self,
        command: str,
        *,
        name: str,
        partition: str,
        nodes: list[str],
        comment: str = "",
        output: str = "/dev/null",
    ) -> int: ...

    async def job(self, job_id: int) -> SlurmJob | None: ...


@runtime_checkable
class SlurmSignalClient(SlurmClient, Protocol):
    """What GPU sharing adds: ask a job to checkpoint through its own signal. Checkable at
    run time: a worker serves the sharing steps only with a client that has it."""

    async def signal_job(self, job_id: int, signal: str) -> None: ...


def _flags(raw: Any) -> list[str]:
    return [str(f) for f in raw or []]


def parse_nodes(doc: dict[str, Any]) -> list[SlurmNode]:
    out = []
    for n in doc.get("nodes", []):
        state = n.get("state", "unknown")
        flags = _flags(n.get("state_flags"))
        # Newer Slurm (23.02+) prints state as a list, e.g. ["IDLE", "DRAIN"].
        if isinstance(state, list):
            base, *rest = [str(s) for s in state] or ["UNKNOWN"]
            state, flags = base, [*rest, *flags]
        out.append(
            SlurmNode(
                name=n["name"],
                state=str(state).lower(),
                state_flags=flags,
                reason=n.get("reason") or "",
                slurmd_start_time=_number(n.get("slurmd_start_time")),
                gres=n.get("gres") or "",
            )
        )
    return out


def _number(raw: Any) -> int:
    # 23.02+ wraps numbers as {"set": true, "number": n}.
    if isinstance(raw, dict):
        return int(raw.get("number") or 0)
    return int(raw or 0)


def _tres_gpus(tres: str) -> int:
    """GPUs in a TRES string such as `cpu=2,node=2,billing=2,gres/gpu=16`."""
    for part in tres.split(","):
        key, _, value = part.partition("=")
        if key == "gres/gpu" and value.isdigit():
            return int(value)
    return 0


def parse_jobs(doc: dict[str, Any]) -> list[SlurmJob]:
    out = []
    for j in doc.get("jobs", []):
        state = j.get("job_state", "")
        if isinstance(state, list):
            state = state[0] if state else ""
        out.append(
            SlurmJob(
                job_id=int(j["job_id"]),
                name=j.get("name") or "",
                job_state=str(state),
                nodes=j.get("nodes") or "",
                restart_cnt=_number(j.get("restart_cnt")),
                state_reason=j.get("state_reason") or "",
                admin_comment=j.get("admin_comment") or "",
                requeue=bool(j.get("requeue")),
                batch_flag=bool(j.get("batch_flag", True)),
                node_count=_number(j.get("node_count")),
                max_nodes=_number(j.get("max_nodes")),
                gpus=_tres_gpus(j.get("tres_req_str") or ""),
                comment=j.get("comment") or "",
            )
        )
    return out


class SlurmCli:
    """Drives Slurm through sinfo/squeue/scontrol; `slurm_conf` picks the cluster."""

    def __init__(
        self, slurm_conf: Path | None = None, bin_dir: Path | None = None, timeout_s: float = 30
    ) -> None:
        self._env = dict(os.environ)
        if slurm_conf is not None:
            self._env["SLURM_CONF"] = str(slurm_conf)
        self._bin_dir = bin_dir
        self._timeout_s = timeout_s

    async def _run(self, *argv: str) -> str:
        exe = str(self._bin_dir / argv[0]) if self._bin_dir else argv[0]
        proc = await asyncio.create_subprocess_exec(
            exe,
            *argv[1:],
            env=self._env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self._timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise SlurmError(f"{' '.join(argv)}: no answer within {self._timeout_s}s") from None
        if proc.returncode != 0:
            msg = (err or out).decode(errors="replace").strip()
            raise SlurmError(f"{' '.join(argv)}: {msg}")
        return out.decode()

    async def _json(self, *argv: str) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(await self._run(*argv, "--json"))
        return doc

    async def nodes(self) -> list[SlurmNode]:
        return parse_nodes(await self._json("sinfo"))

    async def node(self, name: str) -> SlurmNode | None:
        # sinfo --json lists every node whatever -n says on 22.05, so filter here.
        return next((n for n in await self.nodes() if n.name == name), None)

    async def jobs(self) -> list[SlurmJob]:
        return parse_jobs(await self._json("squeue"))

    async def jobs_on_node(self, name: str) -> list[SlurmJob]:
        # squeue --json ignores --nodelist, so match the hostlist here.
        return [j for j in await self.jobs() if name in hostlist.expand(j.nodes)]

    async def drain(self, node: str, reason: str) -> None:
        await self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    async def resume(self, node: str) -> None:
        await self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    async def requeue(self, job_id: int) -> None:
        await self._run("scontrol", "requeue", str(job_id))

    async def release_hold(self, job_id: int) -> None:
        # A requeued batch job waits ~2 minutes (Reason=BeginTime); start it almost at once
        # instead. Not *at* once: slurmd revokes the old run's credential with one-second
        # resolution, and a restart within that same second on a node of the old
        # allocation is killed as "Job credential revoked" and the job FAILS.
        await self._run("scontrol", "update", f"JobId={job_id}", f"StartTime=now+{RESTART_GRACE_S}")

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        await self._run("scontrol", "update", f"JobId={job_id}", f"AdminComment={text}")

    async def cancel(self, job_id: int) -> None:
        await self._run("scancel", str(job_id))

    async def signal_job(self, job_id: int, signal: str) -> None:
        """Send `signal` to the job's batch shell (`scancel --batch`), which by convention
        passes it on to its steps: the job's checkpoint signal (train.sbatch traps USR1,
        checkpoints, and requeues itself)."""
        await self._run("scancel", "--batch", f"--signal={signal}", str(job_id))

    async def submit_batch(
        self,
        command: str,
        *,
        name: str,
        partition: str,
        nodes: list[str],
        comment: str = "",
        output: str = "/dev/null",
    ) -> int:
        """`sbatch --wrap` on exactly `nodes` (one task per node); the job's id."""
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={name}",
            f"--partition={partition}",
            f"--nodes={len(nodes)}",
            f"--nodelist={','.join(nodes)}",
            "--ntasks-per-node=1",
            f"--output={output}",
            "--no-requeue",  # an acceptance run that lost a node failed: never rerun it quietly
        ]
        if comment:
            argv.append(f"--comment={comment}")
        out = await self._run(*argv, f"--wrap={command}")
        # --parsable prints "<id>" or "<id>;<cluster>".
        return int(out.strip().split(";")[0])

    async def job(self, job_id: int) -> SlurmJob | None:
        """The job as slurmctld knows it (ended jobs stay listed for MinJobAge)."""
        return next((j for j in await self.jobs() if j.job_id == job_id), None)
