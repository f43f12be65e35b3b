"""Where an incident's nodes sit (clients/fabric_topology.py): the Kubernetes Nodes' labels
read through the kubernetes client from the Kubernetes API emulator on a loopback socket,
beside topology.conf and under the policy's own topology.

Aspects covered:
- the racks and NVLink domains come from the Nodes' labels, each Node named as its Slurm
  node the way the Kubernetes steps name it (Slinky's hostname-override, else its own
  name): a policy without a rack still places every labelled node (a rack label in its
  rack, an NVLink clique in its NVLink domain); per level, the policy wins over the labels
  and the labels over topology.conf;
- the Nodes are read once per LABELS_MAX_AGE_S, not per incident (a storm reads once);
  past it, a changed label is read;
- a failed read is unknown, not "no labels": the last good map is kept and the log says
  so; with none read yet, the policy and topology.conf alone, and the log says that;
- an API that takes the connection and never answers holds the opening no longer than
  LABELS_READ_BOUND_S.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from autoclusters.clients import fabric_topology
from autoclusters.clients.fabric_topology import with_fabric_topology
from autoclusters.core.policy import GPU_CLIQUE_LABEL, RACK_LABEL, NodeTopology, default_policy
from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import KubernetesSettings, SlurmSettings
from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.slinky_crs import HOSTNAME_OVERRIDE
from autoclusters.sandbox.kubernetes.emulator import Running, running
from tests.emulators.test_kubernetes import write_kubeconfig

TOKEN = "fabric-topology-token"
CLIQUE = "5f2c9a4e-5b1d-4c3e-9f0a-2d7e8b6c1a00.1"
CONF = "SwitchName=leaf-01 Nodes=gpu-[01-04]\nSwitchName=pod-01 Switches=leaf-01\n"


@pytest.fixture
def kube() -> Iterator[Running]:
    with running(TOKEN) as emu:
        yield emu


@pytest.fixture(autouse=True)
def _no_earlier_reads() -> Iterator[None]:
    """Each test reads afresh (the reads are kept per kubeconfig path, for the process)."""
    fabric_topology._labels.clear()
    yield
    fabric_topology._labels.clear()


def register(kube: Running, name: str, labels: dict[str, str], **notes: str) -> None:
    with httpx.Client(base_url=kube.url, timeout=5) as admin:
        admin.post(
            "/_emulator/nodes", json={"name": name, "labels": labels, "annotations": notes}
        ).raise_for_status()


def _settings(tmp_path: Path, kube: Running) -> Settings:
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    (tmp_path / "topology.conf").write_text(CONF)
    return Settings(
        slurm=SlurmSettings(conf=tmp_path / "slurm.conf"),
        kubernetes=KubernetesSettings(
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", kube.url, TOKEN)
        ),
    )


def _closed_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _relabel(settings: Settings, node: str, rack: str) -> None:
    with api_client(kubeconfig=settings.kubernetes.kubeconfig) as api:
        client.CoreV1Api(api).patch_node(node, {"metadata": {"labels": {RACK_LABEL: rack}}})


async def test_racks_from_the_nodes_labels_under_the_policy_over_topology_conf(
    kube: Running, tmp_path: Path
) -> None:
    register(kube, "gpu-01", {RACK_LABEL: "rack-01"})
    register(kube, "gpu-02", {RACK_LABEL: "rack-01"})
    # CMK: the Node is the pool's VM; its Slurm node is its hostname-override.
    register(kube, "pool-gpu-3", {GPU_CLIQUE_LABEL: CLIQUE}, **{HOSTNAME_OVERRIDE: "gpu-03"})
    register(kube, "gpu-04", {})  # no label: its rack is unknown
    settings = _settings(tmp_path, kube)
    policy = default_policy().model_copy(
        update={"topology": {"gpu-02": NodeTopology(rack="rack-from-policy")}}
    )
    topo = (await with_fabric_topology(settings, policy)).topology
    assert topo["gpu-01"] == NodeTopology(leaf="leaf-01", pod="pod-01", rack="rack-01")
    assert topo["gpu-02"] == NodeTopology(leaf="leaf-01", pod="pod-01", rack="rack-from-policy")
    # its NVLink clique is its NVLink domain, not its rack (a level of its own)
    assert topo["gpu-03"] == NodeTopology(leaf="leaf-01", pod="pod-01", nvlink=CLIQUE)
    assert topo["gpu-04"] == NodeTopology(leaf="leaf-01", pod="pod-01")
    assert "pool-gpu-3" not in topo  # a Node is named as its Slurm node


async def test_the_nodes_are_read_once_per_max_age(
    kube: Running, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register(kube, "gpu-01", {RACK_LABEL: "rack-01"})
    settings = _settings(tmp_path, kube)
    first = (await with_fabric_topology(settings, default_policy())).topology
    assert first["gpu-01"].rack == "rack-01"
    _relabel(settings, "gpu-01", "rack-09")
    again = (await with_fabric_topology(settings, default_policy())).topology
    assert again["gpu-01"].rack == "rack-01"  # within LABELS_MAX_AGE_S: not read again
    monkeypatch.setattr(fabric_topology, "LABELS_MAX_AGE_S", 0.0)
    later = (await with_fabric_topology(settings, default_policy())).topology
    assert later["gpu-01"].rack == "rack-09"


@pytest.mark.parametrize("code", [503, 403])  # the API overloaded; no RBAC to list Nodes
async def test_a_failed_read_keeps_the_last_map_and_says_so(
    kube: Running,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    code: int,
) -> None:
    register(kube, "gpu-01", {RACK_LABEL: "rack-01"})
    settings = _settings(tmp_path, kube)
    assert (await with_fabric_topology(settings, default_policy())).topology["gpu-01"].rack
    monkeypatch.setattr(fabric_topology, "LABELS_MAX_AGE_S", 0.0)
    with httpx.Client(base_url=kube.url, timeout=5) as admin:
        admin.post(
            "/_emulator/faults", json={"method": "GET", "path": "/api/v1/nodes", "code": code}
        ).raise_for_status()
    with caplog.at_level(logging.WARNING, logger=fabric_topology.__name__):
        topo = (await with_fabric_topology(settings, default_policy())).topology
    assert topo["gpu-01"] == NodeTopology(leaf="leaf-01", pod="pod-01", rack="rack-01")
    assert "keeping the map read" in caplog.text


async def test_with_no_map_read_yet_a_failed_read_leaves_the_other_sources(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "slurm.conf").write_text("ClusterName=test\n")
    (tmp_path / "topology.conf").write_text(CONF)
    settings = Settings(
        slurm=SlurmSettings(conf=tmp_path / "slurm.conf"),
        kubernetes=KubernetesSettings(
            kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", _closed_url(), TOKEN)
        ),
    )
    policy = default_policy().model_copy(update={"topology": {"gpu-02": NodeTopology(rack="r")}})
    with caplog.at_level(logging.WARNING, logger=fabric_topology.__name__):
        topo = (await with_fabric_topology(settings, policy)).topology
    assert topo["gpu-01"] == NodeTopology(leaf="leaf-01", pod="pod-01")
    assert topo["gpu-02"] == NodeTopology(leaf="leaf-01", pod="pod-01", rack="r")
    assert "none read yet" in caplog.text


async def test_an_api_that_never_answers_holds_the_opening_no_longer_than_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(fabric_topology, "LABELS_READ_BOUND_S", 1.0)
    with socket.socket() as silent:  # takes connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        settings = Settings(
            kubernetes=KubernetesSettings(
                kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", url, TOKEN)
            )
        )
        policy = default_policy().model_copy(
            update={"topology": {"gpu-01": NodeTopology(rack="r")}}
        )
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=fabric_topology.__name__):
            topo = (await with_fabric_topology(settings, policy)).topology
        took = time.monotonic() - start
    assert topo == {"gpu-01": NodeTopology(rack="r")}
    assert took < fabric_topology.LABELS_READ_TIMEOUT_S, took  # the bound, not the client's
    assert "TimeoutError" in caplog.text
