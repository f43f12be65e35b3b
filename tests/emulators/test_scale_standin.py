"""The scale benchmark's stand-in cluster (sandbox/standin_*.py) over real HTTP.

Aspects covered:
- StandInSlurm and StandInCloud are a SlurmBatchClient and a CloudProvider (typed here);
- our Slurm activities run their steps against it: drain, requeue (the job waits on its
  BeginTime hold, the hold is released, the job runs again elsewhere), wait for idle,
  return to service; scontrol's refusals come back as SlurmError;
- a reboot takes the machine down and back with a later slurmd start time and a new boot,
  once per key; the health gate sees all its GPUs; an unknown node is refused for good.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.slurm import SlurmActivities
from autoclusters.core.models import (
    DrainInput,
    RequeueInput,
    ReturnInput,
    WaitIdleInput,
    WaitRegisteredInput,
    drain_reason,
)
from autoclusters.core.policy import Rung
from autoclusters.integrations.cloud import CloudError, CloudProvider
from autoclusters.integrations.health import SlurmHealthGate
from autoclusters.integrations.slurm import SlurmBatchClient, SlurmError
from autoclusters.sandbox.standin.clients import StandInCloud, StandInSlurm
from autoclusters.sandbox.standin.cluster import StandInCluster
from autoclusters.sandbox.standin.server import make_app
from tests.helpers import eventually


@pytest_asyncio.fixture
async def standin() -> AsyncIterator[tuple[StandInCluster, str]]:
    # 16 nodes, 8-node jobs over the first half: gpu-0001..0008 run job 1.
    cluster = StandInCluster(size=16, boot_delay_s=0.3, busy_fraction=0.5)
    runner = web.AppRunner(make_app(cluster), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield cluster, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_our_slurm_steps_run_against_the_stand_in(
    standin: tuple[StandInCluster, str],
) -> None:
    cluster, url = standin
    slurm = StandInSlurm(url)
    typed: SlurmBatchClient = slurm  # mypy checks the shape
    assert typed
    acts, run = SlurmActivities(slurm), ActivityEnvironment().run
    assert len(await slurm.nodes()) == 16
    [job] = await slurm.jobs_on_node("gpu-0003")
    assert (job.job_id, job.job_state, job.requeue) == (1, "RUNNING", True)
    assert await slurm.jobs_on_node("gpu-0012") == []

    reason = drain_reason("INC-1", "XID_79")
    drained = await run(acts.drain_node, DrainInput(node="gpu-0003", reason=reason))
    assert not drained.already_drained
    node = await slurm.node("gpu-0003")
    assert node is not None and node.drained and node.reason == reason

    requeued = await run(
        acts.requeue_jobs, RequeueInput(node="gpu-0003", incident_id="INC-1", poll_s=0.05)
    )
    assert requeued.requeued == [1] and requeued.holds_released == [1]
    idle = await run(
        acts.wait_node_idle, WaitIdleInput(node="gpu-0003", timeout_s=5, force=False, poll_s=0.05)
    )
    assert idle.cancelled == []

    # Released from its hold, the job runs again on eight idle nodes in service.
    async def running_again() -> list[str] | None:
        jobs = await slurm.jobs()
        return jobs[0].nodes.split(",") if jobs[0].job_state == "RUNNING" else None

    again = await eventually(running_again, timeout_s=10, what="the job running again")
    assert len(again) == 8 and "gpu-0003" not in again and jobs_restarts(cluster) == 1

    with pytest.raises(SlurmError, match="Job is pending|Invalid"):
        await slurm.requeue(99)
    back = await run(acts.return_to_service, ReturnInput(node="gpu-0003", incident_id="INC-1"))
    assert back.returned
    with pytest.raises(SlurmError, match="Invalid node state"):
        await slurm.resume("gpu-0003")  # not drained any more
    await slurm.close()


def jobs_restarts(cluster: StandInCluster) -> int:
    return cluster.jobs[1].restart_cnt


async def test_a_reboot_comes_back_once_with_a_new_boot(
    standin: tuple[StandInCluster, str],
) -> None:
    cluster, url = standin
    slurm, cloud = StandInSlurm(url), StandInCloud(url)
    typed: tuple[SlurmBatchClient, CloudProvider] = (slurm, cloud)  # mypy checks the shapes
    assert typed
    vm = await cloud.vm_id("gpu-0012")
    boot = cluster.machines["gpu-0012"].boot_id
    before = time.time()

    done = await cloud.repair("gpu-0012", Rung.REBOOT, "INC-2:1:reboot")
    assert (done.old_vm_id, done.new_vm_id) == (vm, vm)
    assert done.stopped_at is not None and done.stopped_at >= before
    down = await slurm.node("gpu-0012")
    assert down is not None and not down.responding
    again = await cloud.repair("gpu-0012", Rung.REBOOT, "INC-2:1:reboot")
    assert again == done  # the same key: the same repair, not a second one

    acts, run = SlurmActivities(slurm), ActivityEnvironment().run
    up = await run(
        acts.wait_node_registered,
        WaitRegisteredInput(node="gpu-0012", since=done.stopped_at, poll_s=0.05, settle_s=0.1),
    )
    assert up.slurmd_start_time >= int(done.stopped_at)
    assert cluster.take_booted() == [("gpu-0012", cluster.machines["gpu-0012"].boot_id)]
    assert cluster.machines["gpu-0012"].boot_id != boot
    assert cluster.take_booted() == []  # each boot is reported once
    report = await SlurmHealthGate(slurm, expected_gpus=8).check("gpu-0012")
    assert report.passed

    replaced = await cloud.replace("gpu-0013", "INC-3")
    assert replaced.new_vm_id != replaced.old_vm_id
    with pytest.raises(CloudError) as err:
        await cloud.vm_id("gpu-9999")
    assert err.value.non_retryable
    await slurm.close()
    await cloud.close()
