"""The agent's optional GpuUnhealthy condition, with the real kubernetes client against the
loopback Kubernetes emulator:

- a firing fault sets GpuUnhealthy=True with reason Agent<Fault> and the faults as message;
- no fault sets it False again, but only when the agent set it: the incident's own mark
  (set by the remediation workflow) stays;
- each change leaves an Event on the Node;
- unchanged state is not re-patched; an API server that is away is logged, not raised.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client

from autoclusters.clients.agent.node_condition import NodeCondition, reason_for
from autoclusters.core.kubernetes import GPU_UNHEALTHY
from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.kubernetes.emulator import THREAD_NAME, Running, running

TOKEN = "agent-token"
NODE = "gpu-03"


@pytest.fixture
def emulator() -> Iterator[Running]:
    with running(TOKEN) as emu:
        httpx.post(f"{emu.url}/_emulator/nodes", json={"name": NODE}).raise_for_status()
        yield emu
    assert not [t for t in threading.enumerate() if t.name == THREAD_NAME]


@pytest.fixture
def api(emulator: Running, tmp_path: Path) -> Iterator[client.ApiClient]:
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1", "kind": "Config",
                "clusters": [{"name": "e", "cluster": {"server": emulator.url}}],
                "users": [{"name": "e", "user": {"token": TOKEN}}],
                "contexts": [{"name": "e", "context": {"cluster": "e", "user": "e"}}],
                "current-context": "e",
            }
        )
    )  # fmt: skip
    c = api_client(kubeconfig=cfg)
    yield c
    c.close()


def node(api: client.ApiClient) -> Any:
    return client.CoreV1Api(api).read_node_status(NODE)


def condition(api: client.ApiClient) -> Any:
    return next((c for c in node(api).status.conditions or [] if c.type == GPU_UNHEALTHY), None)


def test_reason_names() -> None:
    assert reason_for("XID_79") == "AgentXid79"
    assert reason_for("GPU_FELL_OFF_BUS") == "AgentGpuFellOffBus"


def test_set_while_firing_and_cleared_after(api: client.ApiClient, emulator: Running) -> None:
    nc = NodeCondition(node=NODE, api_client=api)
    nc.update({})
    assert condition(api) is None  # never set: nothing to clear
    nc.update({"XID_79": "GPU 0: Xid 79", "ECC_DBE": "GPU 1: 2 uncorrected"})
    c = condition(api)
    assert (c.status, c.reason) == ("True", "AgentEccDbe")
    assert c.message == "ECC_DBE: GPU 1: 2 uncorrected; XID_79: GPU 0: Xid 79"
    version = node(api).metadata.resource_version
    nc.update({"XID_79": "GPU 0: Xid 79", "ECC_DBE": "GPU 1: 2 uncorrected"})
    assert node(api).metadata.resource_version == version
    nc.update({})
    c = condition(api)
    assert (c.status, c.reason) == ("False", "AgentHealthy")
    assert any(
        x.type == "Ready" for x in node(api).status.conditions
    )  # merged by type: the rest stays
    # One Event on the Node per change of the verdict (the unchanged update made none).
    events = sorted(emulator.store.dump()["events"], key=lambda e: e["metadata"]["name"])
    got = sorted((e["reason"], e["type"], e["involvedObject"]["name"]) for e in events)
    assert got == [("AgentEccDbe", "Warning", NODE), ("AgentHealthy", "Normal", NODE)]


def test_the_incidents_own_mark_is_left_alone(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    mark = {"type": GPU_UNHEALTHY, "status": "True", "reason": "Xid79", "message": "INC-1"}
    core.patch_node_status(NODE, {"status": {"conditions": [mark]}})
    NodeCondition(node=NODE, api_client=api).update({})
    c = condition(api)
    assert (c.status, c.reason, c.message) == ("True", "Xid79", "INC-1")


def test_an_absent_api_server_is_not_fatal(emulator: Running) -> None:
    dead = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    NodeCondition(node=NODE, api_client=dead).update({"XID_79": "x"})  # logged, not raised
    dead.close()
