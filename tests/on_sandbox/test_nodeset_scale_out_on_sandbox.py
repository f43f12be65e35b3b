"""Issue 41 item 5 on a real CMK-platform sandbox: `kubectl scale nodeset` beyond the
NodeSet's Nodes adds a machine that Slurm shows, and scaling back removes it.

The emulated cluster autoscaler (sandbox/slinky/autoscaler.py) grows the NodeSet's node pool
through the Crusoe emulator; the new VM boots and registers its Node, the emulated operator
gives it a slurmd pod, and its kubelet declares the Slurm node and starts `slurmd -N` for it
(sandbox/slinky/kubelet.py). Beyond the pool's max a slurmd pod stays Pending with the
autoscaler's `NotTriggerScaleUp` Event. Scaled back, the added nodes are drained, their pods
and daemons stopped (by PID), their VMs deleted and their Nodes gone.

One sandbox for the module, the tests in order: they tell one story.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import ProcessTable
from autoclusters.sandbox.slinky import autoscaler as slinky_autoscaler
from tests.conftest import free_port_base
from tests.helpers import eventually, kubectl, own_sandbox

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed"),
]
NS = "slurm"
NODESET = "cmk-gpu"  # the example spec's node set `gpu` of cluster `cmk` (its pool too)
ADDED = "cmk-gpu-3"  # the pool's next VM, its Node and (no hostname-override) Slurm node
BOOT_S = 240  # a boot, its Node, the pod and slurmctld's restart, on a busy 2-core host


@pytest_asyncio.fixture(scope="module")
async def cfg(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SandboxConfig]:
    c = SandboxConfig(
        state_dir=tmp_path_factory.mktemp("scale-out"), cluster="cmk", platform="cmk",
        nodes=2, port_base=free_port_base(), boot_delay_s=1, breaker_threshold=100,
        accounting=False, inference=False,
    )  # fmt: skip
    async with own_sandbox(c):
        yield c


def _slurm(cfg: SandboxConfig, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURM_CONF": str(cfg.slurm_conf)}
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=120)


def _sinfo(cfg: SandboxConfig) -> dict[str, str]:
    """Slurm node -> its state, as sinfo shows them; {} when Slurm does not answer (a
    restart of slurmctld under way)."""
    r = _slurm(cfg, "sinfo", "-h", "-N", "-o", "%N %T")
    if r.returncode != 0:
        return {}
    return dict(line.split() for line in r.stdout.splitlines() if line.strip())


def _pods(cfg: SandboxConfig) -> dict[str, Any]:
    out = kubectl(cfg, "get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=slurmd", "-o",
                   "json")  # fmt: skip
    return {p["metadata"]["name"]: p for p in json.loads(out)["items"]}


def _waiting(cfg: SandboxConfig) -> list[Any]:
    """The slurmd pods with no Node (a scale-out's Pending pods)."""
    return [p for p in _pods(cfg).values() if not p["spec"].get("nodeName")]


def _pool(cfg: SandboxConfig) -> dict[str, Any]:
    world = httpx.get(f"http://127.0.0.1:{cfg.crusoe_port}/_emulator/state", timeout=10).json()
    (pool,) = [p for p in world["pools"].values() if p["name"] == NODESET]
    return {**pool, "vms": sorted(world["vms"][i]["name"] for i in pool["instance_ids"])}


async def _async(value: Any) -> Any:
    return value


def _scale(cfg: SandboxConfig, replicas: int) -> None:
    out = kubectl(cfg, "scale", "nodeset", NODESET, "-n", NS, f"--replicas={replicas}")
    assert f"nodeset.slinky.slurm.net/{NODESET} scaled" in out


async def test_scale_out_adds_a_node_that_slurm_shows(cfg: SandboxConfig) -> None:
    assert sorted(_sinfo(cfg)) == ["gpu-01", "gpu-02"]
    assert _pool(cfg)["count"] == 2

    _scale(cfg, 3)

    await eventually(
        lambda: _async(_sinfo(cfg).get(ADDED) == "idle"), BOOT_S, f"{ADDED} idle in sinfo"
    )
    shown = _slurm(cfg, "scontrol", "show", "node", ADDED)
    assert shown.returncode == 0 and "State=IDLE" in shown.stdout, shown.stdout + shown.stderr
    assert "Gres=gpu:8" in shown.stdout
    pool = _pool(cfg)
    assert pool["count"] == 3 and pool["vms"] == ["cmk-gpu-1", "cmk-gpu-2", ADDED]
    # Reported Running once its slurmd answers (the kubelet's next pass at the latest).
    await eventually(
        lambda: _async(_pods(cfg)[f"slurmd-{ADDED}"]["status"].get("phase") == "Running"),
        30, f"slurmd-{ADDED} Running",
    )  # fmt: skip
    assert _pods(cfg)[f"slurmd-{ADDED}"]["spec"]["nodeName"] == ADDED
    assert ProcessTable(cfg.state_dir).alive(f"slurmd-{ADDED}")
    await eventually(lambda: _async(_waiting(cfg) == []), 30, "no Pending pod left")
    events = kubectl(cfg, "get", "events", "-n", NS)
    assert "TriggeredScaleUp" in events and f"{{{NODESET} 2->3 (max: 4)}}" in events
    # A job runs there: the runbook's Slurm sees a node like any other.
    job = _slurm(cfg, "srun", "-p", "gpu", "-w", ADDED, "hostname")
    assert job.returncode == 0, job.stderr


async def test_beyond_the_pools_max_a_pod_stays_pending_and_says_why(cfg: SandboxConfig) -> None:
    top = slinky_autoscaler.max_nodes(cfg)
    assert top == 4

    _scale(cfg, top + 1)

    await eventually(
        lambda: _async(_sinfo(cfg).get("cmk-gpu-4") == "idle"), BOOT_S, "cmk-gpu-4 idle"
    )
    assert _pool(cfg)["count"] == top
    # The Pending pod cmk-gpu-4 took the place of goes (its deletion ends a pass later).
    waiting = await eventually(
        lambda: _async(w if len(w := _waiting(cfg)) == 1 else None), 30, "one pod Pending"
    )
    assert waiting[0]["status"]["phase"] == "Pending"
    name = waiting[0]["metadata"]["name"]
    (cond,) = [c for c in waiting[0]["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert cond["reason"] == "Unschedulable"
    described = kubectl(cfg, "describe", "pod", "-n", NS, name)
    assert "NotTriggerScaleUp" in described
    assert f"node group {NODESET} is at its max size ({top})" in described


async def test_scaling_back_removes_the_added_nodes(cfg: SandboxConfig) -> None:
    table = ProcessTable(cfg.state_dir)
    pids = {n: table.get(f"slurmd-{n}") for n in (ADDED, "cmk-gpu-4")}
    assert all(rec is not None for rec in pids.values())

    _scale(cfg, 2)

    await eventually(
        lambda: _async(sorted(_sinfo(cfg)) == ["gpu-01", "gpu-02"]), BOOT_S,
        "the added nodes out of sinfo",
    )  # fmt: skip
    await eventually(
        lambda: _async(_pool(cfg)["vms"] == ["cmk-gpu-1", "cmk-gpu-2"]), 60,
        "the added VMs deleted",
    )  # fmt: skip
    assert _pool(cfg)["count"] == 2
    nodes = kubectl(cfg, "get", "nodes", "-o", "name")
    assert f"node/{ADDED}" not in nodes and "node/cmk-gpu-4" not in nodes
    assert sorted(_pods(cfg)) == ["slurmd-cmk-gpu-1", "slurmd-cmk-gpu-2"]  # by their Node
    for node, rec in pids.items():
        assert rec is not None and not table.alive(f"slurmd-{node}")
        with pytest.raises(ProcessLookupError):
            os.kill(rec.pid, 0)  # the very process is gone, not only its record
    events = kubectl(cfg, "get", "events", "-A")
    assert "ScaleDown" in events
    # The sandbox's own nodes are as they were.
    assert _sinfo(cfg) == {"gpu-01": "idle", "gpu-02": "idle"}
