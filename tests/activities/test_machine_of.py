"""Which machine a Slurm node is (activities/machine_of.py), through the runbook's Kubernetes
and cloud activities, against the Kubernetes API emulator and the Crusoe emulator on
loopback sockets.

- Managed Slurm names: the Node and the VM share the Slurm node's name; the cloud finds
  the VM by that name, as before.
- CMK names: the pool names the VM and its Node (pool-gpu-2), the Slurm node is the Node's
  hostname-override (gpu-02): the steps act on that Node, the plan records the VM id read
  off its providerID, the repair replaces that VM through AutoClusters remediation and the
  slot ledger learns the new VM; a Node named like the Slurm node that carries another
  Slurm node's name is not it; a Slurm node no Node is is UnknownNode (final).
- A failed read is an outage (retryable), never "no such node".
- Every Slurm node's Node from one list of the Nodes (the API's placement by labels), each
  the one the steps find for that Slurm node (the override; a Ready one before a
  lingering NotReady one).
- After a replacement the new Node (no hostname-override) is given the slot's name once:
  the wait returns it Ready and cordoned, and a retried wait or ledger write changes
  nothing more; a Node that carries another slot's name is never taken.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.cloud import CloudActivities
from autoclusters.activities.kubernetes import KubernetesActivities
from autoclusters.activities.machine_of import (
    Machine,
    MachineOf,
    node_of,
    nodes_by_slurm_node,
    vm_id_of,
)
from autoclusters.core.kubernetes import (
    CordonNodeInput,
    NodeIdentityInput,
    UncordonNodeInput,
    WaitNewNodeInput,
)
from autoclusters.core.models import PlanRepairInput, RepairInput
from autoclusters.core.policy import Rung
from autoclusters.integrations.crusoe import CrusoeClient
from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.slinky_crs import ANN_SLOTS, HOSTNAME_OVERRIDE
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import InMemoryBackend
from autoclusters.sandbox.kubernetes.emulator import Running, running
from tests.emulators.test_crusoe import Emulator, _client, _cloud, _config
from tests.emulators.test_kubernetes import write_kubeconfig

TOKEN = "machine-of-token"
NS = "slurm"
CLUSTER = "cmk-1"
POOL = "pool-1"
SLINKY = ("slinky.slurm.net", "v1beta1", NS, "nodesets")
REASON = "autoclusters: INC-9 XID_79"
SEED = {
    "clusters": [{"id": CLUSTER, "name": "training"}],
    "node_pools": [{"id": POOL, "name": "pool-gpu", "cluster_id": CLUSTER}],
    "vms": [
        {"name": "pool-gpu-1", "node_pool_id": POOL},
        {"name": "pool-gpu-2", "node_pool_id": POOL},
        {"name": "gpu-07"},  # a Managed Slurm machine: VM, Node and Slurm node are one name
    ],
}


@pytest.fixture
def kube() -> Iterator[Running]:
    with running(TOKEN) as emu:
        yield emu


@pytest.fixture
def api(kube: Running, tmp_path: Path) -> Iterator[client.ApiClient]:
    c = api_client(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", kube.url, TOKEN))
    yield c
    c.close()


@pytest.fixture
def crusoe_emu() -> Iterator[Emulator]:
    backend = InMemoryBackend()
    server = EmulatorServer(create_app(_config(), backend)).start()
    emu = Emulator(server, backend)
    try:
        emu.admin("POST", "/vms", SEED)
        yield emu
    finally:
        server.stop()


@pytest_asyncio.fixture
async def crusoe(crusoe_emu: Emulator) -> AsyncIterator[CrusoeClient]:
    async with _client(crusoe_emu) as c:
        yield c


def _vms(crusoe_emu: Emulator) -> dict[str, str]:
    """VM name -> id, as the Crusoe emulator holds them now."""
    state = crusoe_emu.admin("GET", "/state")
    return {vm["name"]: vm["id"] for vm in state["vms"].values()}


def register(kube: Running, name: str, vm_id: str, *, boot: str = "b1", **notes: str) -> None:
    """A machine's kubelet registers its Node (a new providerID: a new Node object)."""
    with httpx.Client(base_url=kube.url, timeout=5) as admin:
        admin.post(
            "/_emulator/nodes",
            json={"name": name, "provider_id": f"crusoe://{vm_id}", "boot_id": boot,
                  "labels": {"crusoe.ai/instance.id": vm_id}, "annotations": notes},
        ).raise_for_status()  # fmt: skip


def slurm_name(slot: str) -> dict[str, str]:
    return {HOSTNAME_OVERRIDE: slot}


def nodeset(api: client.ApiClient, slots: dict[str, Any]) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": NS}})
    body = {
        "apiVersion": "slinky.slurm.net/v1beta1",
        "kind": "NodeSet",
        "metadata": {"name": "alpha-gpu", "annotations": {ANN_SLOTS: json.dumps(slots)}},
        "spec": {"controllerRef": {"name": "alpha"}, "replicas": len(slots)},
    }
    custom.create_namespaced_custom_object(*SLINKY[:3], SLINKY[3], body)


def ledger(api: client.ApiClient) -> tuple[dict[str, Any], str]:
    cr = client.CustomObjectsApi(api).get_namespaced_custom_object(*SLINKY, "alpha-gpu")
    return json.loads(cr["metadata"]["annotations"][ANN_SLOTS]), cr["metadata"]["resourceVersion"]


def node(api: client.ApiClient, name: str) -> Any:
    return client.CoreV1Api(api).read_node(name)


async def test_managed_slurm_names_are_one(api: client.ApiClient, kube: Running) -> None:
    register(kube, "gpu-07", "vm-7")
    assert await MachineOf(api).of("gpu-07") == Machine(slurm_node="gpu-07", vm_name="gpu-07")
    assert await MachineOf(None).of("gpu-07") == Machine(slurm_node="gpu-07", vm_name="gpu-07")
    acts = KubernetesActivities(api, request_timeout_s=5)
    env = ActivityEnvironment()
    await env.run(acts.cordon_node, CordonNodeInput(node="gpu-07", incident_id="INC-9",
                                                    phase="quarantine", reason=REASON))  # fmt: skip
    assert node(api, "gpu-07").spec.unschedulable is True


async def test_managed_slurm_plans_the_vm_of_the_nodes_name(
    api: client.ApiClient, kube: Running, crusoe_emu: Emulator, crusoe: CrusoeClient
) -> None:
    # Its Node is named as the Slurm node (no override): the VM is found by that name, as
    # before, and nothing is read off the Node.
    register(kube, "gpu-07", "not-the-vm-id")
    machines = MachineOf(api, namespace=NS, request_timeout_s=5)
    cloud = CloudActivities(_cloud(crusoe, cluster_id=CLUSTER), machines=machines)
    plan = await ActivityEnvironment().run(
        cloud.plan_repair, PlanRepairInput(node="gpu-07", rung=Rung.REBOOT, key="k")
    )
    assert (plan.node, plan.vm_id) == ("gpu-07", _vms(crusoe_emu)["gpu-07"])


async def test_cmk_names_go_by_the_hostname_override(api: client.ApiClient, kube: Running) -> None:
    register(kube, "pool-gpu-2", "vm-2", **slurm_name("gpu-02"))
    # A Node named like a Slurm node but carrying another's name is that other one's.
    register(kube, "gpu-03", "vm-3", **slurm_name("gpu-09"))
    machines = MachineOf(api)
    assert await machines.of("gpu-02") == Machine("gpu-02", vm_name="pool-gpu-2", vm_id="vm-2")
    acts = KubernetesActivities(api, request_timeout_s=5)
    env = ActivityEnvironment()
    cordon = CordonNodeInput(node="gpu-02", incident_id="INC-9", phase="quarantine", reason=REASON)
    assert (await env.run(acts.cordon_node, cordon)).changed
    assert node(api, "pool-gpu-2").spec.unschedulable is True
    ident = await env.run(acts.node_identity, NodeIdentityInput(node="gpu-02"))
    assert (ident.node, ident.provider_id, ident.unschedulable) == (
        "pool-gpu-2",
        "crusoe://vm-2",
        True,
    )
    await env.run(acts.uncordon_node, UncordonNodeInput(node="gpu-02", incident_id="INC-9"))
    assert not node(api, "pool-gpu-2").spec.unschedulable
    for unknown in ("gpu-03", "gpu-04"):
        with pytest.raises(ApplicationError) as err:
            await env.run(acts.node_identity, NodeIdentityInput(node=unknown))
        assert err.value.type == "UnknownNode" and err.value.non_retryable, unknown


async def test_every_slurm_nodes_node_at_once_is_the_one_the_steps_find(
    api: client.ApiClient, kube: Running
) -> None:
    register(kube, "gpu-07", "vm-7")  # Managed Slurm: the Node of its own name
    register(kube, "pool-gpu-2", "vm-2", **slurm_name("gpu-02"))  # CMK: the override
    register(kube, "gpu-03", "vm-3", **slurm_name("gpu-09"))  # named gpu-03, but gpu-09's
    # An old machine's Node lingers NotReady beside its replacement's: the Ready one.
    register(kube, "pool-gpu-4", "vm-4-old", **slurm_name("gpu-04"))
    with httpx.Client(base_url=kube.url, timeout=5) as admin:
        admin.post("/_emulator/nodes/pool-gpu-4/ready", json={"ready": False}).raise_for_status()
    register(kube, "pool-gpu-5", "vm-4-new", **slurm_name("gpu-04"))
    nodes = json.loads(client.CoreV1Api(api).list_node(_preload_content=False).data)["items"]
    found = nodes_by_slurm_node(nodes)
    assert sorted(found) == ["gpu-02", "gpu-04", "gpu-07", "gpu-09"]
    machines = MachineOf(api, request_timeout_s=5)
    for slurm_node, node in found.items():  # the Node the steps act on, each one
        assert node == node_of(nodes, slurm_node), slurm_node
        assert vm_id_of(node) == vm_id_of(await machines.kube_node(slurm_node) or {})
    assert vm_id_of(found["gpu-04"]) == "vm-4-new"


async def test_a_failed_read_is_an_outage_not_an_unknown_node(
    kube: Running, tmp_path: Path
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    away = api_client(kubeconfig=write_kubeconfig(tmp_path / "away", closed, TOKEN))
    try:
        env = ActivityEnvironment()
        with pytest.raises(ApplicationError) as err:
            await env.run(
                KubernetesActivities(away, request_timeout_s=1).node_identity,
                NodeIdentityInput(node="gpu-02"),
            )
        assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable
        # The cloud steps read the cluster too: the same outage, not "the VM named gpu-02".
        cloud = CloudActivities(_StubCloud(), machines=MachineOf(away, request_timeout_s=1))
        with pytest.raises(ApplicationError) as err:
            await env.run(cloud.plan_repair, PlanRepairInput(node="gpu-02", rung=Rung.REPLACE,
                                                             key="k"))  # fmt: skip
        assert err.value.type == "KubernetesUnavailable" and not err.value.non_retryable
    finally:
        away.close()
    # And the emulator answering 503 to the Node list is the same.
    with httpx.Client(base_url=kube.url, timeout=5) as admin:
        admin.post("/_emulator/faults", json={"method": "GET", "path": "/api/v1/nodes", "times": 1})
    up = api_client(kubeconfig=write_kubeconfig(tmp_path / "up", kube.url, TOKEN))
    try:
        with pytest.raises(ApplicationError) as err:
            await ActivityEnvironment().run(
                KubernetesActivities(up, request_timeout_s=5).node_identity,
                NodeIdentityInput(node="gpu-02"),
            )
        assert err.value.type == "KubernetesUnavailable"
    finally:
        up.close()


class _StubCloud:
    """A cloud that must never be asked: the read before it failed."""

    async def vm_id(self, node: str) -> str:
        raise AssertionError(f"asked for the VM of {node}")

    async def machine_spec(self, node: str, vm_id: str) -> dict[str, Any]:
        raise AssertionError(node)


async def test_a_cmk_replacement_is_recorded_and_its_new_node_named_once(
    api: client.ApiClient, kube: Running, crusoe_emu: Emulator, crusoe: CrusoeClient
) -> None:
    vms = _vms(crusoe_emu)
    old = vms["pool-gpu-2"]
    register(kube, "pool-gpu-1", vms["pool-gpu-1"], **slurm_name("gpu-01"))
    register(kube, "pool-gpu-2", old, **slurm_name("gpu-02"))
    nodeset(api, {"gpu-01": {"vm": vms["pool-gpu-1"], "attempt": 1},
                  "gpu-02": {"vm": old, "attempt": 1}})  # fmt: skip
    machines = MachineOf(api, namespace=NS, request_timeout_s=5)
    cloud = CloudActivities(_cloud(crusoe, cluster_id=CLUSTER), machines=machines)
    k8s = KubernetesActivities(api, request_timeout_s=5, machines=machines)
    env = ActivityEnvironment()
    before = await env.run(k8s.node_identity, NodeIdentityInput(node="gpu-02"))

    # The plan records the VM read off the Node (not a VM named gpu-02: there is none).
    plan = await env.run(cloud.plan_repair, PlanRepairInput(node="gpu-02", rung=Rung.REPLACE,
                                                            key="INC-9:1:replace"))  # fmt: skip
    assert (plan.node, plan.vm_id, plan.machine_spec) == ("gpu-02", old, {})
    repair = RepairInput(node="gpu-02", rung=Rung.REPLACE, key="INC-9:1:replace",
                         vm_id=plan.vm_id, planned_at=plan.planned_at)  # fmt: skip
    done = await env.run(cloud.repair_node, repair)
    new = _vms(crusoe_emu)["pool-gpu-2"]
    assert (done.node, done.old_vm_id, done.new_vm_id) == ("gpu-02", old, new) and new != old
    slots, version = ledger(api)
    assert slots == {"gpu-01": {"vm": vms["pool-gpu-1"], "attempt": 1},
                     "gpu-02": {"vm": new, "attempt": 1}}  # fmt: skip
    # Written once: a retry finds it written.
    assert await machines.replaced("gpu-02", old, new)
    assert ledger(api) == (slots, version)

    # The machine's kubelet registers a new Node under the VM's name, with no Slurm name.
    register(kube, "pool-gpu-2", new, boot="b2")
    assert not (node(api, "pool-gpu-2").metadata.annotations or {}).get(HOSTNAME_OVERRIDE)
    wait = WaitNewNodeInput(
        node="gpu-02",
        old_provider_id=before.provider_id,
        old_boot_id=before.boot_id,
        cordon=CordonNodeInput(node="gpu-02", incident_id="INC-9", phase="health-gate",
                               reason=REASON),
        poll_s=0.05,
    )  # fmt: skip
    ident = await env.run(k8s.wait_new_node_ready, wait)
    assert (ident.node, ident.provider_id) == ("pool-gpu-2", f"crusoe://{new}")
    now = node(api, "pool-gpu-2")
    assert now.metadata.annotations[HOSTNAME_OVERRIDE] == "gpu-02"
    assert now.spec.unschedulable is True  # cordoned on sight, under the Slurm name
    # A retried wait acts no more: the Node is named and cordoned already.
    again = await env.run(k8s.wait_new_node_ready, wait)
    assert (again.uid, again.provider_id, again.boot_id) == (ident.uid, ident.provider_id, "b2")
    assert node(api, "pool-gpu-2").metadata.resource_version == now.metadata.resource_version
    assert await machines.of("gpu-02") == Machine("gpu-02", vm_name="pool-gpu-2", vm_id=new)


async def test_a_node_of_another_slot_is_never_taken(api: client.ApiClient, kube: Running) -> None:
    # The ledger says gpu-02 holds vm-5 now, but vm-5's Node carries gpu-05: not taken.
    register(kube, "pool-gpu-5", "vm-5", **slurm_name("gpu-05"))
    nodeset(api, {"gpu-02": {"vm": "vm-5", "attempt": 2}})
    machines = MachineOf(api, namespace=NS, request_timeout_s=5)
    assert await machines.new_node("gpu-02", "crusoe://vm-2") is None
    assert node(api, "pool-gpu-5").metadata.annotations[HOSTNAME_OVERRIDE] == "gpu-05"
    # Without a ledger entry for the slot nothing is named, and a slot holding another VM
    # than the one replaced is not moved.
    assert not await machines.replaced("gpu-04", "vm-4", "vm-6")
    assert not await machines.replaced("gpu-02", "vm-2", "vm-6")
    assert ledger(api)[0] == {"gpu-02": {"vm": "vm-5", "attempt": 2}}


async def test_without_slinky_crds_there_is_no_ledger(api: client.ApiClient) -> None:
    # No slurm namespace, no NodeSet: nothing tracks a slot (not an error).
    machines = MachineOf(api, namespace="nowhere", request_timeout_s=5)
    assert await machines.ledger_vm("gpu-01") == ""
    assert not await machines.replaced("gpu-01", "a", "b")
