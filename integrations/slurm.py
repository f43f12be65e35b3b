"""Talking to Slurm.

`SlurmClient` is the small interface the activities need; `SlurmCli` implements it with
the Slurm commands and their `--json` output. A slurmrestd implementation can sit beside
it later without touching the activities.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from autoclusters.core import hostlist
from autoclusters.core.holders import HOLDER_NAME, holder_comment
from autoclusters.core.models import SlurmJob, SlurmNode
from autoclusters.core.unavailable import DB_INDEX_REFUSAL, Unavailable

# slurmctld timestamps a requeue's credential revocation with its own clock, in whole
# seconds; a restart must get its new credential in a later second (see release_hold).
# This worker's clock may differ from slurmctld's by up to this much (NTP keeps real
# clusters within milliseconds).
CLOCK_MARGIN_S = 0.5


class SlurmError(RuntimeError):
    """A Slurm command failed; the message carries the command and what Slurm said."""


class UnknownNodeError(SlurmError):
    pass


class SlurmUnavailable(Unavailable, SlurmError):
    """slurmctld gave no trustworthy answer: unreachable, timed out, or a `--json` document
    with errors (22.05's sinfo/squeue exit 0 with `"nodes": []` / `"jobs": []` and an
    `errors` array while the controller is down). Never read as "no nodes" or "no jobs"."""

    def __init__(self, message: str) -> None:
        super().__init__("slurmctld", message)


# What Slurm's commands print when they cannot reach the controller (or it is restarting):
# a write that failed this way may be tried again; anything else is a real refusal.
_UNREACHABLE = (
    "unable to contact slurm controller",
    "socket timed out",
    "zero bytes were transmitted",
    "connection refused",
    "communication connection failure",
    "connection reset",
    "slurm backup controller in standby mode",
    "slurmctld is not responding",
    "controller is not responding",
    "temporarily unavailable",
    # 22.05's scontrol requeue / update JobId= while the controller is down (captured:
    # tests/data/slurm-22.05-controller-down/).
    "unexpected message received",
    # A restarted slurmctld refuses job updates until slurmdbd has given the job its
    # database index (ci5 of 2026-12-06, the recheck after a controller crash): not yet,
    # not no.
    DB_INDEX_REFUSAL,
)


def unreachable(message: str) -> bool:
    """Does a Slurm command's error say the controller could not be reached?"""
    low = message.lower()
    return any(p in low for p in _UNREACHABLE)


def checked_document(raw: str, key: str, command: str) -> dict[str, Any]:
    """A `--json` document that can be trusted, or SlurmUnavailable.

    Unknown is not empty: empty or unparseable output, a non-empty `errors` array, or a
    document without `key` says nothing about the cluster.
    """
    if not raw.strip():
        raise SlurmUnavailable(f"{command} --json printed nothing")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise SlurmUnavailable(f"{command} --json printed no JSON ({e})") from None
    if not isinstance(doc, dict):
        raise SlurmUnavailable(f"{command} --json printed {type(doc).__name__}, not an object")
    errors = [e for e in doc.get("errors") or [] if e]
    if errors:
        raise SlurmUnavailable(f"{command}: {_error_text(errors)}")
    if not isinstance(doc.get(key), list):
        raise SlurmUnavailable(f"{command} --json has no {key!r} list")
    return doc


def _error_text(errors: list[Any]) -> str:
    """22.05: [{"error": "...", "errno": 1007}]; 23.02+: [{"description", "error_number", ...}]."""
    parts = []
    for e in errors[:3]:
        if isinstance(e, dict):
            text = e.get("error") or e.get("description") or ""
            code = e.get("errno", e.get("error_number"))
            parts.append(f"{text} (errno {code})" if code is not None else str(text))
        else:
            parts.append(str(e))
    return "; ".join(p for p in parts if p) or "errors reported"


class SlurmClient(Protocol):
    async def nodes(self) -> list[SlurmNode]: ...
    async def node(self, name: str) -> SlurmNode | None: ...
    async def jobs(self) -> list[SlurmJob]: ...
    async def jobs_on_node(self, name: str) -> list[SlurmJob]: ...
    async def drain(self, node: str, reason: str) -> None: ...
    async def resume(self, node: str) -> None: ...
    async def requeue(self, job_id: int) -> None: ...
    async def release_hold(self, job_id: int, seen_pending_at: float | None = None) -> None: ...
    async def set_admin_comment(self, job_id: int, text: str) -> None: ...
    async def cancel(self, job_id: int) -> None: ...
    # When slurmctld started ("" if it does not say): a different answer later means it
    # restarted, and may have come back with its state from before its last writes.
    async def controller_started(self) -> str: ...


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


@runtime_checkable
class SlurmInJobClient(SlurmClient, Protocol):
    """What in-job recovery adds: shrink a running job's allocation to the nodes it keeps,
    and signal the processes of its steps (not its batch shell). Checkable at run time, as
    SlurmSignalClient."""

    async def shrink_job(self, job_id: int, nodes: list[str]) -> None: ...
    async def signal_steps(self, job_id: int, signal: str) -> None: ...


@runtime_checkable
class SlurmHolderClient(SlurmInJobClient, Protocol):
    """What standbys held outside the job add (core/holders.py): submit a holder job on a
    node, write a job's Comment (a holder's claim), and signal a job's batch shell (the
    training job's launcher, told that a holder was assigned to it)."""

    async def submit_holder(self, node: str) -> int: ...
    async def set_comment(self, job_id: int, text: str) -> None: ...
    async def signal_job(self, job_id: int, signal: str) -> None: ...


@runtime_checkable
class SlurmFencingClient(SlurmClient, Protocol):
    """What fencing a lost node adds: mark it DOWN (its drain and reason kept), so that
    slurmctld ends the requeued jobs still completing there at once instead of after its
    RPC timeouts and SlurmdTimeout; and the controller's ReturnToService, which decides
    whether a node set DOWN by hand comes back by itself when its slurmd registers.
    And a hold for the requeued jobs meanwhile: DOWN ends their completing at once, with
    none of the begin-time delay a requeue otherwise ends with, so the scheduler may start
    them again within the second of their kill, on a node that has just revoked their
    credential ("Job credential revoked": the job FAILS, not requeued). Seen on the
    sandbox (ci12 of 2026-12-06); the hold keeps them until that second has passed."""

    async def mark_down(self, node: str, reason: str) -> None: ...
    async def return_to_service(self) -> int | None: ...
    async def hold(self, job_id: int) -> None: ...
    async def release(self, job_id: int) -> None: ...


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


def config_value(config: str, name: str) -> str:
    """One setting from `scontrol show config`'s text (`BOOT_TIME = 2026-12-05T06:00:00`);
    "" when it is not there."""
    for line in config.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == name:
            return value.strip()
    return ""


def boot_time(config: str) -> str:
    """BOOT_TIME from `scontrol show config`'s text."""
    return config_value(config, "BOOT_TIME")


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
                batch_host=j.get("batch_host") or "",
                restart_cnt=_number(j.get("restart_cnt")),
                state_reason=j.get("state_reason") or "",
                eligible_time=_number(j.get("eligible_time")),
                admin_comment=j.get("admin_comment") or "",
                requeue=bool(j.get("requeue")),
                batch_flag=bool(j.get("batch_flag", True)),
                node_count=_number(j.get("node_count")),
                max_nodes=_number(j.get("max_nodes")),
                gpus=_tres_gpus(j.get("tres_req_str") or ""),
                comment=j.get("comment") or "",
                user=j.get("user_name") or "",
                command=j.get("command") or "",
                work_dir=j.get("current_working_directory") or "",
                submit_line=j.get("submit_line") or "",
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

    async def _run(self, *argv: str, read: bool = False) -> str:
        """Run one Slurm command. A read that failed in any way, and a write that could not
        reach the controller (or got no answer: it may or may not have been applied, and
        every write here is idempotent), is SlurmUnavailable; any other failed write is a
        refusal (SlurmError)."""
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
            await _end(proc)
            raise SlurmUnavailable(
                f"{' '.join(argv)}: no answer within {self._timeout_s}s"
            ) from None
        except asyncio.CancelledError:
            # The call was abandoned (an activity cancelled, the worker or the API shutting
            # down): the command goes with it, rather than retrying an absent slurmctld on
            # its own for a minute.
            await _end(proc)
            raise
        if proc.returncode != 0:
            msg = (err or out).decode(errors="replace").strip()
            if read or unreachable(msg):
                raise SlurmUnavailable(f"{' '.join(argv)}: {msg or f'exit {proc.returncode}'}")
            raise SlurmError(f"{' '.join(argv)}: {msg}")
        return out.decode(errors="replace")

    async def _json(self, command: str, key: str) -> dict[str, Any]:
        return checked_document(await self._run(command, "--json", read=True), key, command)

    async def nodes(self) -> list[SlurmNode]:
        nodes = parse_nodes(await self._json("sinfo", "nodes"))
        if not nodes:
            # A configured cluster always has nodes: an empty list is a controller that did
            # not answer in full, not a cluster of size 0.
            raise SlurmUnavailable("sinfo --json listed no nodes")
        return nodes

    async def node(self, name: str) -> SlurmNode | None:
        # sinfo --json lists every node whatever -n says on 22.05, so filter here.
        return next((n for n in await self.nodes() if n.name == name), None)

    async def jobs(self) -> list[SlurmJob]:
        return parse_jobs(await self._json("squeue", "jobs"))

    async def jobs_on_node(self, name: str) -> list[SlurmJob]:
        # squeue --json ignores --nodelist, so match the hostlist here.
        return [j for j in await self.jobs() if name in hostlist.expand(j.nodes)]

    async def drain(self, node: str, reason: str) -> None:
        await self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")

    async def resume(self, node: str) -> None:
        await self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")

    async def mark_down(self, node: str, reason: str) -> None:
        # 22.05: a drained node set DOWN shows DOWN+DRAIN; when its slurmd answers again
        # (ReturnToService=2) it is IDLE+DRAIN, the reason kept (measured on the sandbox).
        await self._run("scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason={reason}")

    async def hold(self, job_id: int) -> None:
        # 22.05 holds a requeued job while it still completes (measured on the sandbox:
        # JobHeldAdmin, priority 0), and the hold outlives its node's DOWN.
        await self._run("scontrol", "hold", str(job_id))

    async def release(self, job_id: int) -> None:
        await self._run("scontrol", "release", str(job_id))

    async def return_to_service(self) -> int | None:
        """ReturnToService from `scontrol show config` (None when it does not say)."""
        config = await self._run("scontrol", "show", "config", read=True)
        value = config_value(config, "ReturnToService")
        return int(value) if value.isdigit() else None

    async def requeue(self, job_id: int) -> None:
        await self._run("scontrol", "requeue", str(job_id))

    async def release_hold(self, job_id: int, seen_pending_at: float | None = None) -> None:
        """Let a requeued job start now, once that is safe; `seen_pending_at` is when the
        caller read the job PENDING (default: now), so that jobs released from one read
        wait for one safe instant, not one each."""
        # A requeued batch job waits ~2 minutes (Reason=BeginTime); start it almost at once
        # instead. Not *at* once: slurmd revokes the old run's credential with one-second
        # resolution, and a restart within that same second on a node of the old
        # allocation is killed as "Job credential revoked" and the job FAILS. The job is
        # PENDING only after the revocation, so once the clock has passed the next whole
        # second after it was seen so, the restart is safe. Then StartTime=now, not a begin
        # time in the future: the update itself wakes the scheduler, where a future begin
        # time waits for its next periodic pass (sched_interval: 60 s by default).
        seen = time.time() if seen_pending_at is None else seen_pending_at
        safe_at = math.floor(seen + CLOCK_MARGIN_S) + 1
        await asyncio.sleep(max(0.0, safe_at - time.time()))
        await self._run("scontrol", "update", f"JobId={job_id}", "StartTime=now")

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        await self._run("scontrol", "update", f"JobId={job_id}", f"AdminComment={text}")

    async def set_comment(self, job_id: int, text: str) -> None:
        await self._run("scontrol", "update", f"JobId={job_id}", f"Comment={text}")

    async def submit_holder(self, node: str) -> int:
        """A holder job on `node` (core/holders.py): one node, a `sleep` as its batch
        script, never requeued (a holder on a faulty node is cancelled and a new one
        submitted once the node is back), `--overlap` steps launched into it later."""
        out = await self._run(
            "sbatch", "--parsable", f"--job-name={HOLDER_NAME}", "--nodes=1",
            f"--nodelist={node}", "--exclusive", "--no-requeue", "--output=/dev/null",
            f"--comment={holder_comment(None)}", "--wrap=exec sleep infinity",
        )  # fmt: skip
        return int(out.strip().split(";")[0])

    async def controller_started(self) -> str:
        """slurmctld's BOOT_TIME from `scontrol show config` ("" when it prints none)."""
        return boot_time(await self._run("scontrol", "show", "config", read=True))

    async def cancel(self, job_id: int) -> None:
        await self._run("scancel", str(job_id))

    async def signal_job(self, job_id: int, signal: str) -> None:
        """Send `signal` to the job's batch shell (`scancel --batch`), which by convention
        passes it on to its steps: the job's checkpoint signal (train.sbatch traps USR1,
        checkpoints, and requeues itself)."""
        await self._run("scancel", "--batch", f"--signal={signal}", str(job_id))

    async def signal_steps(self, job_id: int, signal: str) -> None:
        """Send `signal` to the processes of every step of the running job, on the nodes it
        holds now (`scancel --signal`: without --batch/--full, never to the batch shell and
        its children, srun included). slurmctld queues it to the slurmds and answers at
        once; a job with no step running is not an error."""
        await self._run("scancel", f"--signal={signal}", str(job_id))

    async def shrink_job(self, job_id: int, nodes: list[str]) -> None:
        """Release every node of the running job but `nodes`. Slurm (22.05, measured) kills
        the job's steps on each released node ("Killing JobId=N StepId=0 on failed node"),
        keeps the steps running elsewhere when they were started with --no-kill, and frees
        the node; a node whose slurmd does not answer has its processes killed when it
        answers again (its reboot). It refuses to release the batch host: "Invalid node
        name specified" ("You cannot remove the batch host from a job when resizing")."""
        await self._run("scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(nodes)}")

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


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill a Slurm command still running and reap it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    await proc.wait()
