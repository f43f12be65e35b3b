"""The worker's side of the stand-in cluster (sandbox/standin/server.py): a `SlurmClient`
and a `CloudProvider` over HTTP, wired into our activities in place of `SlurmCli` and
`CrusoeCloud` by the scale benchmark's worker (bench/scale_worker.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from autoclusters.core.models import RepairResult, ReplaceResult, SlurmJob, SlurmNode
from autoclusters.core.policy import Rung
from autoclusters.integrations.cloud import CloudError
from autoclusters.integrations.slurm import SlurmError


class _Http:
    """One keep-alive session per process, opened on first use (on the worker's loop)."""

    def __init__(self, base_url: str, timeout_s: float = 30) -> None:
        self._base = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=64)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self._open().request(method, self._base + path, json=body) as r:
            return r.status, await r.json()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


class StandInSlurm:
    """`SlurmBatchClient` on the stand-in; scontrol's refusals come back as SlurmError."""

    def __init__(self, base_url: str) -> None:
        self._http = _Http(base_url)

    async def _ok(self, method: str, path: str, body: Any = None) -> Any:
        try:
            status, data = await self._http.call(method, path, body)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SlurmError(f"stand-in {path}: {e!r}") from e
        if status != 200:
            raise SlurmError(data.get("error", f"stand-in {path}: HTTP {status}"))
        return data

    async def close(self) -> None:
        await self._http.close()

    async def nodes(self) -> list[SlurmNode]:
        return [SlurmNode.model_validate(n) for n in await self._ok("GET", "/slurm/nodes")]

    async def node(self, name: str) -> SlurmNode | None:
        data = await self._ok("GET", f"/slurm/nodes/{name}")
        return SlurmNode.model_validate(data) if data is not None else None

    async def jobs(self) -> list[SlurmJob]:
        return [SlurmJob.model_validate(j) for j in await self._ok("GET", "/slurm/jobs")]

    async def jobs_on_node(self, name: str) -> list[SlurmJob]:
        listed = await self._ok("GET", f"/slurm/jobs?node={name}")
        return [SlurmJob.model_validate(j) for j in listed]

    async def drain(self, node: str, reason: str) -> None:
        await self._ok("POST", f"/slurm/nodes/{node}/drain", {"reason": reason})

    async def resume(self, node: str) -> None:
        await self._ok("POST", f"/slurm/nodes/{node}/resume")

    async def requeue(self, job_id: int) -> None:
        await self._ok("POST", f"/slurm/jobs/{job_id}/requeue")

    async def release_hold(self, job_id: int, seen_pending_at: float | None = None) -> None:
        # The stand-in has no job credentials to wait out: released at once.
        await self._ok("POST", f"/slurm/jobs/{job_id}/release_hold")

    async def set_admin_comment(self, job_id: int, text: str) -> None:
        await self._ok("POST", f"/slurm/jobs/{job_id}/admin_comment", {"text": text})

    async def cancel(self, job_id: int) -> None:
        await self._ok("POST", f"/slurm/jobs/{job_id}/cancel")

    async def controller_started(self) -> str:
        return ""  # the stand-in's controller never restarts under an incident

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
        raise SlurmError("the stand-in runs no batch jobs (cluster provisioning is not benched)")

    async def job(self, job_id: int) -> SlurmJob | None:
        return next((j for j in await self.jobs() if j.job_id == job_id), None)


class StandInCloud:
    """`CloudProvider` on the stand-in: one request per repair, idempotent by key."""

    def __init__(self, base_url: str) -> None:
        self._http = _Http(base_url)

    async def _ok(self, method: str, path: str, body: Any = None) -> Any:
        try:
            status, data = await self._http.call(method, path, body)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise CloudError(f"stand-in {path}: {e!r}") from e
        if status != 200:
            err = CloudError(data.get("error", f"stand-in {path}: HTTP {status}"))
            err.non_retryable = status == 404
            raise err
        return data

    async def close(self) -> None:
        await self._http.close()

    async def vm_id(self, node: str) -> str:
        return str((await self._ok("GET", f"/cloud/vms/{node}"))["vm_id"])

    async def machine_spec(self, node: str, vm_id: str) -> dict[str, Any]:
        return {}  # the stand-in replaces machines itself

    async def repair(
        self,
        node: str,
        rung: Rung,
        idempotency_key: str,
        *,
        vm_id: str | None = None,
        planned_at: float | None = None,
        machine_spec: Mapping[str, Any] | None = None,
        progress: Mapping[str, Any] | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
    ) -> RepairResult:
        body = {"node": node, "rung": rung.value, "key": idempotency_key}
        done = await self._ok("POST", "/cloud/repair", body)
        if on_progress is not None:
            on_progress({"key": idempotency_key, "done": True})
        return RepairResult.model_validate(done)

    async def replace(self, node: str, idempotency_key: str) -> ReplaceResult:
        done = await self.repair(node, Rung.REPLACE, idempotency_key)
        return ReplaceResult(
            node=node,
            old_vm_id=done.old_vm_id,
            new_vm_id=done.new_vm_id,
            stopped_at=done.stopped_at if done.stopped_at is not None else time.time(),
        )
