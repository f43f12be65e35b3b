"""Issue 41 item 5 on a Kubernetes-mode sandbox on Managed Slurm (`sandbox up --k8s`):
`kubectl scale nodeset gpu --replicas=3` adds a machine that Slurm shows, and scaling back
removes it.

The emulated cluster autoscaler (sandbox/slinky/autoscaler.py, sandbox/slinky/node_groups.py) adds
the node to the Managed Slurm cluster's configuration and makes its VM like the others; the
machine starts its slurmd and registers its Node, where the emulated operator puts the
NodeSet's slurmd pod. Scaled back, the node is drained, its pod deleted, the node taken out
of the configuration and its VM deleted, its daemons stopped by PID.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable
from tests.conftest import free_port_base
from tests.helpers import eventually, kubectl, own_sandbox
from tests.on_sandbox.test_nodeset_scale_out_on_sandbox import (
    BOOT_S,
    NS,
    _async,
    _pods,
    _sinfo,
    _slurm,
    _waiting,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]

ADDED = "gpu-03"  # the next free machine name of the node set gpu-01, gpu-02


@pytest_asyncio.fixture(scope="module")
async def cfg(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SandboxConfig]:
    c = SandboxConfig(
        state_dir=tmp_path_factory.mktemp("scale-out-managed"), cluster="managed", nodes=2,
        port_base=free_port_base(), boot_delay_s=1, k8s=True, breaker_threshold=100,
        accounting=False, inference=False,
    )  # fmt: skip
    async with own_sandbox(c):
        yield c


async def test_scale_out_and_back_on_managed_slurm(cfg: SandboxConfig) -> None:
    assert _sinfo(cfg) == {"gpu-01": "idle", "gpu-02": "idle"}

    out = kubectl(cfg, "scale", "nodeset", "gpu", "-n", NS, "--replicas=3")
    assert "nodeset.slinky.slurm.net/gpu scaled" in out

    await eventually(
        lambda: _async(_sinfo(cfg).get(ADDED) == "idle"), BOOT_S, f"{ADDED} idle in sinfo"
    )
    shown = _slurm(cfg, "scontrol", "show", "node", ADDED)
    assert "State=IDLE" in shown.stdout and "Gres=gpu:8" in shown.stdout, shown.stderr
    await eventually(lambda: _async(_waiting(cfg) == []), 30, "no Pending pod left")
    assert _pods(cfg)[f"slurmd-{ADDED}"]["spec"]["nodeName"] == ADDED
    events = kubectl(cfg, "get", "events", "-n", NS)
    assert "TriggeredScaleUp" in events and "{gpu 2->3 (max: 4)}" in events
    job = _slurm(cfg, "srun", "-w", ADDED, "hostname")
    assert job.returncode == 0, job.stderr
    table = ProcessTable(cfg.state_dir)
    slurmd, agent = table.get(f"slurmd-{ADDED}"), table.get(f"agent-{ADDED}")
    assert slurmd is not None and agent is not None

    kubectl(cfg, "scale", "nodeset", "gpu", "-n", NS, "--replicas=2")

    await eventually(
        lambda: _async(sorted(_sinfo(cfg)) == ["gpu-01", "gpu-02"]), BOOT_S,
        f"{ADDED} out of sinfo",
    )  # fmt: skip
    await eventually(
        lambda: _async(f"node/{ADDED}" not in kubectl(cfg, "get", "nodes", "-o", "name")),
        60, f"node {ADDED} gone",
    )  # fmt: skip
    assert sorted(_pods(cfg)) == ["slurmd-gpu-01", "slurmd-gpu-02"]
    for rec in (slurmd, agent):
        await eventually(lambda r=rec: _async(not _alive(r.pid)), 30, f"{rec.name} stopped")
    assert _sinfo(cfg) == {"gpu-01": "idle", "gpu-02": "idle"}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
