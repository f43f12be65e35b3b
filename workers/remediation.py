"""The remediation worker: hosts NodeRemediation, the cluster's FleetGuard and the
activities they call."""

from __future__ import annotations

import asyncio
import logging
import signal
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from activities.cloud import CloudActivities
from activities.guard import GuardActivities
from activities.health import HealthActivities
from activities.notify import NotifyActivities
from activities.slurm import SlurmActivities
from autoclusters import temporal
from autoclusters.cloud import CloudProvider
from autoclusters.health import HealthGate
from autoclusters.notify import LogNotifier, Notifier
from autoclusters.settings import Settings
from autoclusters.slurm import SlurmCli, SlurmClient
from workflows.fleet_guard import FleetGuard
from workflows.remediation import NodeRemediation

log = logging.getLogger("autoclusters.worker")

WORKFLOWS = [NodeRemediation, FleetGuard]


def cloud_provider(settings: Settings) -> CloudProvider:
    if settings.cloud_provider == "sandbox":
        from sandbox.cloud import SandboxCloud

        if settings.sandbox_state_dir is None:
            raise ValueError("cloud_provider=sandbox needs sandbox_state_dir")
        return SandboxCloud(settings.sandbox_state_dir, boot_delay_s=settings.boot_delay_s)
    raise ValueError(f"unknown cloud provider {settings.cloud_provider!r}")


def health_gate(settings: Settings, slurm: SlurmClient) -> HealthGate:
    if settings.cloud_provider == "sandbox":
        from sandbox.health import SandboxHealth

        if settings.sandbox_state_dir is None:
            raise ValueError("cloud_provider=sandbox needs sandbox_state_dir")
        return SandboxHealth(settings.sandbox_state_dir, slurm)
    raise ValueError(f"no health gate for {settings.cloud_provider!r}")


def activities_for(
    slurm: SlurmClient,
    cloud: CloudProvider,
    health: HealthGate,
    guard: GuardActivities,
    notifiers: list[Notifier] | None = None,
) -> list[Any]:
    s, c, h = SlurmActivities(slurm), CloudActivities(cloud), HealthActivities(health)
    n = NotifyActivities(notifiers if notifiers is not None else [LogNotifier()])
    return [
        s.drain_node,
        s.requeue_jobs,
        s.wait_node_idle,
        s.wait_node_registered,
        s.return_to_service,
        c.repair_node,
        c.replace_node,
        h.health_gate,
        guard.register,
        guard.admit_quarantine,
        guard.admit_repair,
        guard.release,
        n.notify,
    ]


def build_worker(
    client: Client, settings: Settings, slurm: SlurmClient, cloud: CloudProvider, health: HealthGate
) -> Worker:
    guard = GuardActivities(client, slurm, settings.task_queue)
    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=WORKFLOWS,
        activities=activities_for(slurm, cloud, health, guard),
        graceful_shutdown_timeout=timedelta(seconds=5),
    )


async def run(settings: Settings) -> None:
    client = await temporal.connect(settings)
    slurm = SlurmCli(settings.slurm_conf, settings.slurm_bin_dir)
    worker = build_worker(
        client, settings, slurm, cloud_provider(settings), health_gate(settings, slurm)
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info("worker polling %s on %s", settings.task_queue, settings.temporal_address)
    async with worker:
        await stop.wait()
    log.info("worker stopped")
