"""A rack-level systemic incident from the Kubernetes Nodes' labels alone: the Nodes carry
the sandbox's rack and NVLink clique labels (sandbox/machines/racks.py) in the Kubernetes
API emulator, the API places the nodes as an incident opens (clients/fabric_topology.py,
a policy that names no rack, no topology.conf), and the fleet guard, on the time-skipping
test server, groups the faults of one rack into one systemic incident.

Aspects covered:
- three NVLINK_DOWN faults on rack-01's nodes within the window are one systemic incident
  of level `rack`, domain `rack-01`; a fault on rack-02's node is no member;
- without the labels (a Node that carries none), the same faults make no systemic incident:
  grouping needs a known domain, and the labels were what made it known;
- an NVLink domain is a level of its own (the shipped policy's `nvlink` threshold): three
  NVLINK_DOWN faults in one NVLink clique that spans two racks are one systemic incident of
  level `nvlink`, domain the clique, though no rack has three; a node of another clique is
  no member.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from autoclusters.clients import fabric_topology
from autoclusters.clients.fabric_topology import with_fabric_topology
from autoclusters.core.guard import GuardInput, guard_workflow_id
from autoclusters.core.policy import (
    GPU_CLIQUE_LABEL,
    RACK_LABEL,
    GuardPolicy,
    NodeTopology,
    SystemicLevel,
    SystemicPolicy,
    default_policy,
)
from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import KubernetesSettings
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.sandbox.machines.racks import rack_labels
from autoclusters.workflows.fleet_guard import FleetGuard
from tests.emulators.test_kubernetes import write_kubeconfig
from tests.workflows.test_systemic_guard import Member, _open

TOKEN = "systemic-labels-token"
NODES = [f"gpu-{i:02d}" for i in range(1, 9)]
RACKS = SystemicPolicy(
    enabled=True, leaf=None, rack=SystemicLevel(min_nodes=3, window_s=60, faults=["NVLINK_DOWN"])
)


@pytest.fixture
def kube() -> Iterator[Running]:
    fabric_topology._labels.clear()  # read afresh from this test's emulator
    with running(TOKEN) as emu:
        yield emu
    fabric_topology._labels.clear()


async def _topology_from_labels(
    kube: Running,
    tmp_path: Path,
    *,
    labelled: bool,
    labels_of: Callable[[str], dict[str, str]] = rack_labels,
) -> dict[str, NodeTopology]:
    """The topology an incident opens with where the Nodes carry the sandbox's labels
    (`labels_of`, or none): no rack in the policy, no topology.conf."""
    with httpx.Client(base_url=kube.url, timeout=5) as admin:
        for node in NODES:
            labels = labels_of(node) if labelled else {}
            admin.post("/_emulator/nodes", json={"name": node, "labels": labels}).raise_for_status()
    settings = Settings(
        kubernetes=KubernetesSettings(
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", kube.url, TOKEN)
        )
    )
    policy = default_policy()
    assert policy.guard.systemic.enabled and not policy.topology and settings.slurm.conf is None
    return (await with_fabric_topology(settings, policy)).topology


async def _four_faults(
    env: WorkflowEnvironment, topology: dict[str, NodeTopology], systemic: SystemicPolicy
) -> list[Any]:
    """NVLINK_DOWN on gpu-01, gpu-05, gpu-02 and gpu-03, in that order, through a fleet guard
    with `systemic` over `topology`: the guard's answer to each."""
    task_queue, cluster = f"tq-{uuid.uuid4()}", f"test-{uuid.uuid4().hex[:8]}"
    policy = GuardPolicy(min_in_service_fraction=0.5, breaker_threshold=10, systemic=systemic)
    async with Worker(env.client, task_queue=task_queue, workflows=[FleetGuard, Member]):
        g = await env.client.start_workflow(
            FleetGuard.run,
            GuardInput(cluster=cluster, policy=policy, topology=topology),
            id=guard_workflow_id(cluster),
            task_queue=task_queue,
        )
        try:
            return [
                (await _open(env, g, task_queue, node, fault="NVLINK_DOWN"))[0]
                for node in ("gpu-01", "gpu-05", "gpu-02", "gpu-03")
            ]
        finally:
            await g.terminate("test over")


@pytest.mark.parametrize("labelled", [True, False])
async def test_a_racks_faults_are_one_systemic_incident_from_labels_alone(
    env: WorkflowEnvironment, kube: Running, tmp_path: Path, labelled: bool
) -> None:
    topology = await _topology_from_labels(kube, tmp_path, labelled=labelled)
    *earlier, third = await _four_faults(env, topology, RACKS)
    assert all(a.systemic is None for a in earlier)
    if not labelled:
        assert topology == {} and third.systemic is None  # no rack known: no grouping
        return
    assert topology["gpu-01"].rack == topology["gpu-03"].rack == "rack-01"
    assert topology["gpu-05"].rack == "rack-02"
    m = third.systemic
    assert m is not None and (m.level, m.domain) == ("rack", "rack-01")
    assert m.nodes == ["gpu-01", "gpu-02", "gpu-03"]  # gpu-05 (rack-02) is no member


# Racks of two nodes, NVLink cliques of four: a clique that spans two racks (not a GB200
# NVL72, where the two coincide).
CLIQUE_A, CLIQUE_B = (
    "0b9e4d52-8f1a-4c6e-9d3b-7a2c5e1f0a11.1",
    "0b9e4d52-8f1a-4c6e-9d3b-7a2c5e1f0a11.2",
)


def _split_labels(node: str) -> dict[str, str]:
    i = int(node.rsplit("-", 1)[1]) - 1
    return {RACK_LABEL: f"rack-{i // 2 + 1:02d}", GPU_CLIQUE_LABEL: (CLIQUE_A, CLIQUE_B)[i // 4]}


async def test_an_nvlink_domains_faults_are_one_systemic_incident_from_labels_alone(
    env: WorkflowEnvironment, kube: Running, tmp_path: Path
) -> None:
    topology = await _topology_from_labels(kube, tmp_path, labelled=True, labels_of=_split_labels)
    assert topology["gpu-01"] == NodeTopology(nvlink=CLIQUE_A, rack="rack-01")
    assert topology["gpu-03"] == NodeTopology(nvlink=CLIQUE_A, rack="rack-02")
    assert topology["gpu-05"] == NodeTopology(nvlink=CLIQUE_B, rack="rack-03")
    shipped = default_policy().guard.systemic  # its nvlink level counts NVLINK_DOWN
    assert shipped.nvlink is not None and shipped.nvlink.counts("NVLINK_DOWN")
    *earlier, third = await _four_faults(env, topology, shipped)
    assert all(a.systemic is None for a in earlier)  # rack-01's two alone group nothing
    m = third.systemic
    assert m is not None and (m.level, m.domain) == ("nvlink", CLIQUE_A)
    assert m.nodes == ["gpu-01", "gpu-02", "gpu-03"]  # gpu-05 (the other clique) is no member
