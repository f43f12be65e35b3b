"""Provider crusoe-cmk's activities against the Crusoe emulator (node pools) and the
Kubernetes API emulator (Slinky and Crusoe objects), both on loopback sockets, with an
in-memory Slurm for Slurm's side.

Aspects: the Controller is created once and adopted by a retry, accounting / home / login
are their objects (the Controller references the Accounting); slots created in parallel
share one node pool grown to exactly their number, each holding its own VM, a retry adopts
its VM, and deleting them in parallel shrinks the pool to zero; a quota refusal is
QuotaExceeded and creates no pool and no VM; a failed boot is booted=False, its delete
shrinks the pool (no refill) and the next attempt grows it again; a retried delete shrinks
it once; booted waits for a joined node to be Ready; a restarted emulator boots the pool
VMs it cut short; configure_slurm writes topology.conf into the ConfigMap, the NodeSet's
partition and the nodes' Slurm names, and cordons a drained slot with Slinky's reason until
it registers (then Slurm's drain holds it);
users are SlurmUsers; deletes are idempotent and the controller's takes the pools and
objects with it; inventory lists the parts and the slots' machines; without a CMK
configuration crusoe-cmk is refused. Before the Controller, the CMK cluster is read: one
that does not exist, is not running or lacks the Slurm operator's add-on is refused
(non-retryable, naming it) with nothing made, and the API not answering stays a retryable
outage.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.cluster_provider import ClusterProviderActivities
from autoclusters.activities.cluster_providers.cmk import CMK_CLUSTER_UNUSABLE, CmkProvider
from autoclusters.activities.cluster_providers.registry import PROVIDER_UNAVAILABLE
from autoclusters.core.cluster import (
    QUOTA_EXCEEDED,
    ClusterRef,
    DeleteCall,
    Machine,
    MachineCall,
    NodeSetNodes,
    ProviderCall,
    Resource,
    SlurmConfigCall,
    TopologyCall,
    UsersCall,
)
from autoclusters.core.cluster_spec import ClusterSpec, NodeSetSpec, UserSpec
from autoclusters.core.settings import Settings
from autoclusters.core.settings_groups import CrusoeSettings, KubernetesSettings
from autoclusters.integrations.crusoe import CrusoeClient
from autoclusters.integrations.k8s import api_client
from autoclusters.integrations.slinky_crs import (
    ANN_SLOTS,
    CORDON_REASON,
    HOSTNAME_OVERRIDE,
    KubeObjects,
    slots_of,
)
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import InMemoryBackend
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.workers.remediation import cluster_provider
from tests.activities.test_cluster_provider import KEY, BatchSlurm
from tests.emulators.test_crusoe import PROJECT, Emulator, _client, _config
from tests.emulators.test_kubernetes import write_kubeconfig

CMK = "cmk-cluster-1"
# The CMK cluster the provider runs on: the Slurm operator's add-on installed.
CMK_SEED = {"id": CMK, "name": "training", "add_ons": ["slurm_operator"]}
NS = "slurm"
TOKEN = "cmk-test-token"
SLINKY = ("slinky.slurm.net", "v1beta1", NS)


def _spec(name: str = "alpha", *, count: int = 2, ib: str | None = "ib-part-1") -> ClusterSpec:
    return ClusterSpec(
        name=name,
        provider="crusoe-cmk",
        location="us-east1-a",
        accounting=True,
        login={"count": 2, "ssh_public_keys": [KEY]},  # type: ignore[arg-type]
        shared_home={"size": "10Ti"},  # type: ignore[arg-type]
        node_sets=[
            NodeSetSpec(
                name="gpu",
                instance_type="h100-80gb-sxm-ib.8x",
                count=count,
                partition="batch",
                ib_partition=ib,
            )
        ],
        users=[UserSpec(name="alice", ssh_public_keys=[KEY], slurm_account="research")],
    )


def _ref(spec: ClusterSpec) -> ClusterRef:
    return ClusterRef(name=spec.name, provider=spec.provider, location=spec.location)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    backend = InMemoryBackend()
    server = EmulatorServer(create_app(_config(), backend)).start()
    emu = Emulator(server, backend)
    try:
        emu.admin("POST", "/vms", {"clusters": [CMK_SEED]})
        yield emu
    finally:
        server.stop()


@pytest.fixture
def kube_emulator() -> Iterator[Running]:
    with running(TOKEN) as emu:
        yield emu


@pytest.fixture
def api(kube_emulator: Running, tmp_path: Path) -> Iterator[client.ApiClient]:
    c = api_client(kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", kube_emulator.url, TOKEN))
    yield c
    c.close()


@pytest.fixture
def custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


@pytest_asyncio.fixture
async def crusoe(emulator: Emulator) -> AsyncIterator[CrusoeClient]:
    async with _client(emulator) as c:
        yield c


@pytest.fixture
def slurm() -> BatchSlurm:
    return BatchSlurm()


def _on(
    cmk_cluster_id: str, crusoe: CrusoeClient, api: client.ApiClient, slurm: BatchSlurm
) -> ClusterProviderActivities:
    """The provider's activities on the CMK cluster `cmk_cluster_id`."""
    cmk = CmkProvider(
        crusoe,
        KubeObjects(api, NS, timeout_s=10),
        slurm,
        cmk_cluster_id=cmk_cluster_id,
        poll_s=0.02,
        register_timeout_s=0.5,
        acceptance_timeout_s=2,
        lock_ttl_s=10,
    )
    return ClusterProviderActivities(crusoe, slurm, poll_s=0.02, cmk=cmk)


@pytest.fixture
def provider(
    crusoe: CrusoeClient, api: client.ApiClient, slurm: BatchSlurm
) -> ClusterProviderActivities:
    return _on(CMK, crusoe, api, slurm)


_activity_ids = iter(range(1, 1_000_000))


def _run(activity_id: str | None = None) -> Any:
    """One activity execution (its own activity id, as Temporal gives each)."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, activity_id=activity_id or str(next(_activity_ids)), workflow_run_id="run-1"
    )
    return env.run


async def _controller(p: ClusterProviderActivities, spec: ClusterSpec) -> Resource:
    made: Resource = await _run()(p.create_controller, ProviderCall(cluster=_ref(spec), spec=spec))
    return made


async def _machine(
    p: ClusterProviderActivities, spec: ClusterSpec, node: str, attempt: int = 1
) -> Machine:
    call = MachineCall(cluster=_ref(spec), node_set=spec.node_sets[0], node=node, attempt=attempt)
    machine: Machine = await _run()(p.create_machine, call)
    return machine


def _pools(emulator: Emulator) -> list[dict[str, Any]]:
    return list(emulator.admin("GET", "/state")["pools"].values())


def _vms(emulator: Emulator) -> dict[str, dict[str, Any]]:
    vms: dict[str, dict[str, Any]] = emulator.admin("GET", "/state")["vms"]
    return vms


def _obj(custom: client.CustomObjectsApi, plural: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom.get_namespaced_custom_object(*SLINKY, plural, name)
    return obj


async def _until_running(crusoe: CrusoeClient, vm_ids: list[str]) -> None:
    deadline = time.monotonic() + 10
    while {vm.state for vm in await crusoe.list_vms(ids=vm_ids)} != {"RUNNING"}:
        assert time.monotonic() < deadline, "the pool's VMs never ran"
        await asyncio.sleep(0.02)


# --- the cluster's parts -------------------------------------------------------------------


async def test_the_controller_is_created_once_and_the_parts_are_its_objects(
    provider: ClusterProviderActivities, custom: client.CustomObjectsApi
) -> None:
    spec = _spec()
    first = await _controller(provider, spec)
    again = await _controller(provider, spec)
    assert first == again == Resource(kind="controller", id="alpha", name="alpha")
    ctl = _obj(custom, "controllers", "alpha")
    assert ctl["spec"]["configFileRefs"] == [{"name": "alpha-slurm-conf"}]
    assert ctl["metadata"]["generation"] == 1  # adopted, not rewritten

    call = ProviderCall(cluster=_ref(spec), spec=spec, controller=first)
    acct = await _run()(provider.create_accounting, call)
    assert await _run()(provider.create_accounting, call) == acct
    home = await _run()(provider.create_shared_home, call)
    login = await _run()(provider.create_login_nodes, call)
    assert acct == Resource(kind="accounting", id="alpha-accounting", name="alpha-accounting")
    assert home == Resource(kind="shared_home", id="alpha-home", name="alpha-home-10240Gi")
    assert login == Resource(kind="login", id="alpha-login", name="alpha-login")
    assert _obj(custom, "controllers", "alpha")["spec"]["accountingRef"] == {
        "name": "alpha-accounting"
    }
    loginset = _obj(custom, "loginsets", "alpha-login")
    assert loginset["spec"]["replicas"] == 2 and KEY in loginset["spec"]["rootSshAuthorizedKeys"]
    claim = client.CoreV1Api(custom.api_client).read_namespaced_persistent_volume_claim(
        "alpha-home", NS
    )
    assert claim.spec.resources.requests == {"storage": "10240Gi"}


# --- the CMK cluster, before anything is made ------------------------------------------------


def _no_controller(custom: client.CustomObjectsApi, name: str) -> bool:
    try:
        _obj(custom, "controllers", name)
    except client.ApiException as e:
        return e.status == 404
    return False


@pytest.mark.parametrize(
    ("seed", "why"),
    [
        (None, "does not exist in project proj-1"),
        (
            {"state": "STATE_PROVISIONING", "add_ons": ["slurm_operator"]},
            "is STATE_PROVISIONING, not STATE_RUNNING",
        ),
        (
            {"add_ons": ["crusoe_csi", "nvidia_gpu_operator"]},
            "lacks the slurm_operator add-on",
        ),
    ],
    ids=["missing", "not-running", "no-slurm-operator"],
)
async def test_an_unusable_cmk_cluster_is_refused_before_anything_is_made(
    emulator: Emulator,
    crusoe: CrusoeClient,
    api: client.ApiClient,
    slurm: BatchSlurm,
    custom: client.CustomObjectsApi,
    seed: dict[str, Any] | None,
    why: str,
) -> None:
    if seed is not None:
        emulator.admin("POST", "/vms", {"clusters": [{"id": "cmk-other", "name": "other", **seed}]})
    spec = _spec()
    with pytest.raises(ApplicationError) as err:
        await _controller(_on("cmk-other", crusoe, api, slurm), spec)
    assert err.value.type == CMK_CLUSTER_UNUSABLE and err.value.non_retryable
    assert "CMK cluster cmk-other" in str(err.value) and why in str(err.value)
    assert _no_controller(custom, spec.name) and _pools(emulator) == []


async def test_an_outage_reading_the_cmk_cluster_stays_retryable(
    emulator: Emulator, provider: ClusterProviderActivities, custom: client.CustomObjectsApi
) -> None:
    # More 503s than the client's attempts (4): the read never gets an answer.
    cluster_path = f"/v1/projects/{PROJECT}/kubernetes/clusters/{CMK}"
    emulator.inject(status=503, count=10, method="GET", path_prefix=cluster_path)
    spec = _spec()
    with pytest.raises(ApplicationError) as err:
        await _controller(provider, spec)
    assert err.value.type == "CrusoeUnavailable" and not err.value.non_retryable
    assert _no_controller(custom, spec.name)

    emulator.admin("DELETE", "/inject")  # the API is back: the retry goes through
    assert await _controller(provider, spec) == Resource(
        kind="controller", id="alpha", name="alpha"
    )


# --- machines ------------------------------------------------------------------------------


async def test_parallel_slots_share_one_pool_and_none_is_lost(
    emulator: Emulator,
    crusoe: CrusoeClient,
    provider: ClusterProviderActivities,
    custom: client.CustomObjectsApi,
) -> None:
    spec = _spec(count=5)
    await _controller(provider, spec)
    nodes = spec.node_sets[0].node_names()
    machines = await asyncio.gather(*(_machine(provider, spec, n) for n in nodes))

    assert [m.node for m in machines] == nodes
    assert len({m.machine_id for m in machines}) == 5  # each slot its own VM
    [pool] = _pools(emulator)
    assert pool["name"] == "alpha-gpu" and pool["cluster_id"] == CMK
    assert pool["count"] == 5 and sorted(pool["instance_ids"]) == sorted(
        m.machine_id for m in machines
    )
    assert pool["product_name"] == "h100-80gb-sxm-ib.8x"
    assert pool["transport_partition_id"] == "ib-part-1"
    assert pool["node_labels"] == {
        "autoclusters.crusoe.ai/cluster": "alpha",
        "autoclusters.crusoe.ai/node-set": "gpu",
    }
    nodeset = _obj(custom, "nodesets", "alpha-gpu")
    assert nodeset["spec"]["controllerRef"] == {"name": "alpha"}
    assert "autoclusters.crusoe.ai/pool-lock" not in nodeset["metadata"]["annotations"]
    assert ANN_SLOTS in nodeset["metadata"]["annotations"]

    # A retry of a slot adopts its VM: no new one, the pool unchanged.
    again = await _machine(provider, spec, nodes[1])
    assert again.machine_id == machines[1].machine_id
    assert _pools(emulator)[0]["count"] == 5 and len(_vms(emulator)) == 5
    await _until_running(crusoe, [m.machine_id for m in machines])

    # Deleted in parallel (a teardown), each shrinks the pool once and none is refilled.
    ref = _ref(spec)
    await asyncio.gather(
        *(_run()(provider.delete, DeleteCall(cluster=ref, resource=m.resource())) for m in machines)
    )
    [pool] = _pools(emulator)
    assert pool["count"] == 0 and pool["instance_ids"] == [] and _vms(emulator) == {}
    assert slots_of(_obj(custom, "nodesets", "alpha-gpu")) == {}


async def test_quota_refusal_creates_no_pool_and_no_vm(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec = _spec()
    await _controller(provider, spec)
    emulator.admin("POST", "/quota", {"max_vms": 0})
    with pytest.raises(ApplicationError) as err:
        await _machine(provider, spec, "gpu-01")
    assert err.value.type == QUOTA_EXCEEDED and err.value.non_retryable
    assert "quota" in str(err.value)
    assert _pools(emulator) == [] and _vms(emulator) == {}

    # Within quota the pool is made; growing past it is refused and leaves the count.
    emulator.admin("POST", "/quota", {"max_vms": 1})
    await _machine(provider, spec, "gpu-01")
    with pytest.raises(ApplicationError) as err:
        await _machine(provider, spec, "gpu-02")
    assert err.value.type == QUOTA_EXCEEDED
    [pool] = _pools(emulator)
    assert pool["count"] == 1 and len(_vms(emulator)) == 1


async def test_a_failed_boot_is_replaced_through_the_pool(
    emulator: Emulator, crusoe: CrusoeClient, provider: ClusterProviderActivities
) -> None:
    spec = _spec(count=1)
    await _controller(provider, spec)
    emulator.admin("POST", "/boot-faults", {"name": "*", "mode": "fail", "count": 1})
    first = await _machine(provider, spec, "gpu-01")
    boot = await _run()(provider.wait_booted, first)
    assert not boot.booted and "FAILED" in boot.detail

    delete = DeleteCall(cluster=_ref(spec), resource=first.resource())
    await _run()(provider.delete, delete)
    await _run()(provider.delete, delete)  # idempotent
    [pool] = _pools(emulator)
    assert pool["count"] == 0 and pool["instance_ids"] == []
    await asyncio.sleep(0.3)  # longer than a refill would take: none comes
    assert _vms(emulator) == {}

    second = await _machine(provider, spec, "gpu-01", attempt=2)
    assert second.machine_id != first.machine_id and second.attempt == 2
    assert (await _run()(provider.wait_booted, second)).booted
    assert _pools(emulator)[0]["count"] == 1


async def test_a_retried_machine_delete_shrinks_the_pool_once(
    emulator: Emulator, crusoe: CrusoeClient, provider: ClusterProviderActivities
) -> None:
    spec = _spec(count=2)
    await _controller(provider, spec)
    first, second = [await _machine(provider, spec, n) for n in ("gpu-01", "gpu-02")]
    # The VM's delete is refused once: the pool was already shrunk when the try failed.
    emulator.inject(
        status=400,
        method="DELETE",
        path_prefix=f"/v1/projects/{PROJECT}/compute/vms/instances/{first.machine_id}",
    )
    delete = DeleteCall(cluster=_ref(spec), resource=first.resource())
    with pytest.raises(ApplicationError):
        await _run("delete-1")(provider.delete, delete)
    assert _pools(emulator)[0]["count"] == 1
    await _run("delete-1")(provider.delete, delete)  # the activity's retry

    [pool] = _pools(emulator)
    assert pool["count"] == 1 and pool["instance_ids"] == [second.machine_id]
    inv = await _run()(provider.inventory, _ref(spec))
    assert inv.machines == [second]


async def test_a_restarted_emulator_boots_the_pool_vms_it_cut_short(tmp_path: Path) -> None:
    state = tmp_path / "crusoe.json"
    slow = EmulatorServer(create_app(_config(state_file=state, boot_delay_s=60))).start()
    try:
        slow_emu = Emulator(slow, InMemoryBackend())
        slow_emu.admin("POST", "/vms", {"clusters": [CMK_SEED]})
        async with _client(slow_emu) as c:
            op = await c.create_node_pool(
                {"cluster_id": CMK, "name": "p", "product_name": "c1a.4x", "count": 1}
            )
            await c.wait_operation(op, "node_pool", poll_s=0.02)
            [vm] = await c.list_vms()
            assert vm.state == "DEFINING"
    finally:
        slow.stop()
    fast = EmulatorServer(create_app(_config(state_file=state))).start()
    try:
        async with _client(Emulator(fast, InMemoryBackend())) as c:
            await _until_running(c, [vm.id])
            [pool] = await c.list_node_pools()
            assert pool.instance_ids == [vm.id] and pool.count == 1
    finally:
        fast.stop()


async def test_booted_waits_for_a_joined_node_to_be_ready(
    emulator: Emulator,
    crusoe: CrusoeClient,
    provider: ClusterProviderActivities,
    kube_emulator: Running,
) -> None:
    spec = _spec(count=1)
    await _controller(provider, spec)
    machine = await _machine(provider, spec, "gpu-01")
    await _until_running(crusoe, [machine.machine_id])
    vm = await crusoe.get_vm(machine.machine_id)
    with httpx.Client(base_url=kube_emulator.url, timeout=5) as admin:
        admin.post(
            "/_emulator/nodes",
            json={"name": vm.name, "provider_id": f"crusoe://{vm.id}", "ready": False},
        ).raise_for_status()
        waiting = asyncio.ensure_future(_run()(provider.wait_booted, machine))
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        assert not done, "booted before its node was Ready"
        admin.post(f"/_emulator/nodes/{vm.name}/ready", json={"ready": True}).raise_for_status()
        assert (await asyncio.wait_for(waiting, timeout=10)).booted


# --- Slurm -----------------------------------------------------------------------------------


async def test_configure_writes_topology_partition_and_node_names(
    emulator: Emulator,
    crusoe: CrusoeClient,
    provider: ClusterProviderActivities,
    slurm: BatchSlurm,
    kube_emulator: Running,
    custom: client.CustomObjectsApi,
) -> None:
    spec = _spec(count=2)
    await _controller(provider, spec)
    ref = _ref(spec)
    machines = [await _machine(provider, spec, n) for n in ("gpu-01", "gpu-02")]
    await _until_running(crusoe, [m.machine_id for m in machines])
    vms = {vm.id: vm for vm in await crusoe.list_vms()}
    with httpx.Client(base_url=kube_emulator.url, timeout=5) as admin:
        for m in machines:  # the pool's VMs join the CMK cluster as nodes of their name
            vm = vms[m.machine_id]
            admin.post(
                "/_emulator/nodes",
                json={"name": vm.name, "provider_id": f"crusoe://{vm.id}", "boot_id": "b1"},
            ).raise_for_status()
    now = int(time.time())
    slurm.add_node("gpu-01", slurmd_start_time=now)
    slurm.add_node("gpu-02", slurmd_start_time=now)

    placements = await _run()(
        provider.discover_topology, TopologyCall(cluster=ref, machines=machines)
    )
    assert all(p.leaf for p in placements)
    call = SlurmConfigCall(
        cluster=ref,
        node_sets=[
            NodeSetNodes(name="gpu", partition="batch", gpus_per_node=8, nodes=["gpu-01", "gpu-02"])
        ],
        machines=machines,
        topology_conf="SwitchName=leaf-01 Nodes=gpu-01,gpu-02\n",
        accounting=True,
        drained={"gpu-02": "autoclusters: new node"},
    )
    core = client.CoreV1Api(custom.api_client)
    second_vm = vms[machines[1].machine_id].name
    cordoned_at_registration: list[bool] = []
    read_nodes = slurm.nodes

    async def nodes() -> list[Any]:  # what the Node was while the slurmd registered
        node = await asyncio.to_thread(core.read_node, second_vm)
        cordoned_at_registration.append(bool(node.spec.unschedulable))
        return await read_nodes()

    slurm.nodes = nodes  # type: ignore[method-assign]
    result = await _run()(provider.configure_slurm, call)
    assert result.registered == ["gpu-01", "gpu-02"]
    assert cordoned_at_registration and all(cordoned_at_registration)

    cm = core.read_namespaced_config_map("alpha-slurm-conf", NS)
    assert cm.data == {"topology.conf": "SwitchName=leaf-01 Nodes=gpu-01,gpu-02\n"}
    nodeset = _obj(custom, "nodesets", "alpha-gpu")
    assert nodeset["spec"]["replicas"] == 2
    assert nodeset["spec"]["partition"]["config"].startswith("PartitionName=batch")
    first, second = (core.read_node(vms[m.machine_id].name) for m in machines)
    assert first.metadata.annotations[HOSTNAME_OVERRIDE] == "gpu-01"
    assert not first.spec.unschedulable
    assert second.metadata.annotations[HOSTNAME_OVERRIDE] == "gpu-02"
    # Registered, the slot is held by Slurm's drain under the caller's reason and its Node
    # is uncordoned: a cordon left in place would drain it again once it is returned.
    drained = {n.name: n for n in await read_nodes()}
    assert drained["gpu-02"].drained and drained["gpu-02"].reason == "autoclusters: new node"
    assert not drained["gpu-01"].drained
    assert CORDON_REASON not in second.metadata.annotations
    assert not second.spec.unschedulable

    users = await _run()(
        provider.add_users, UsersCall(cluster=ref, users=spec.users, accounting=True)
    )
    assert users.added == ["alice"]
    user = custom.get_namespaced_custom_object(
        "slurm.crusoe.ai", "v1alpha1", NS, "slurmusers", "alpha-alice"
    )
    assert user["spec"]["clusterReference"] == "alpha" and user["spec"]["sshPublicKeys"] == [KEY]


# --- deleting and listing ---------------------------------------------------------------------


async def test_inventory_and_idempotent_deletes(
    emulator: Emulator,
    provider: ClusterProviderActivities,
    custom: client.CustomObjectsApi,
) -> None:
    spec = _spec(count=2)
    controller = await _controller(provider, spec)
    call = ProviderCall(cluster=_ref(spec), spec=spec, controller=controller)
    parts = [
        controller,
        await _run()(provider.create_accounting, call),
        await _run()(provider.create_shared_home, call),
        await _run()(provider.create_login_nodes, call),
    ]
    machines = [await _machine(provider, spec, n) for n in ("gpu-01", "gpu-02")]
    other = _spec("beta", count=1)
    await _controller(provider, other)
    await _machine(provider, other, "gpu-01")

    inv = await _run()(provider.inventory, _ref(spec))
    assert inv.resources[:4] == parts
    assert inv.machines == machines
    assert inv.resources[4:] == [m.resource() for m in machines]

    ref = _ref(spec)
    await _run()(provider.delete, DeleteCall(cluster=ref, resource=machines[0].resource()))
    assert [m.node for m in (await _run()(provider.inventory, ref)).machines] == ["gpu-02"]
    for res in reversed(parts):
        await _run()(provider.delete, DeleteCall(cluster=ref, resource=res))
        await _run()(provider.delete, DeleteCall(cluster=ref, resource=res))  # 404: gone

    gone = await _run()(provider.inventory, ref)
    assert gone.resources == [] and gone.machines == []
    assert [p["name"] for p in _pools(emulator)] == ["beta-gpu"]  # the other cluster's stays
    assert len(_vms(emulator)) == 1
    left = custom.list_namespaced_custom_object(*SLINKY, "nodesets")["items"]
    assert [o["metadata"]["name"] for o in left] == ["beta-gpu"]


# --- without a CMK configuration ----------------------------------------------------------------


async def test_crusoe_cmk_is_refused_without_a_cmk_configuration(
    crusoe: CrusoeClient, slurm: BatchSlurm
) -> None:
    bare = ClusterProviderActivities(crusoe, slurm, poll_s=0.02)
    spec = _spec()
    with pytest.raises(ApplicationError) as err:
        await _controller(bare, spec)
    assert err.value.type == PROVIDER_UNAVAILABLE and err.value.non_retryable


def test_the_worker_serves_crusoe_cmk_only_with_a_kubeconfig_and_a_cluster_id(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CRUSOE_ACCESS_KEY_ID", "ak")
    monkeypatch.setenv("CRUSOE_SECRET_KEY", "c2VjcmV0")
    monkeypatch.setenv("CRUSOE_DEFAULT_PROJECT", "proj-1")
    monkeypatch.setenv("CRUSOE_API_ENDPOINT", "http://127.0.0.1:9/v1")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", "http://127.0.0.1:9", TOKEN)
    plain = cluster_provider(
        Settings(kubernetes=KubernetesSettings(kubeconfig=kubeconfig)), BatchSlurm()
    )
    assert plain is not None and plain._cmk is None
    both = cluster_provider(
        Settings(
            kubernetes=KubernetesSettings(kubeconfig=kubeconfig),
            crusoe=CrusoeSettings(cluster_id=CMK),
        ),
        BatchSlurm(),
    )
    assert both is not None and isinstance(both._cmk, CmkProvider)
