"""The cluster provider's activities (providers sandbox / crusoe-managed-slurm) against the
Crusoe emulator over a loopback socket, with an in-memory Slurm for Slurm's side.

Aspects: the controller is created once and adopted by a retry or when it exists already,
its accounting / home / login parts are read from it; a quota refusal is QuotaExceeded with
the provider's message and creates nothing; a retried machine create adopts its VM, a
failed boot is booted=False with the provider's reason and the next attempt makes a new VM;
topology comes from the VMs; configure_slurm writes the layout and returns only the nodes
that registered; the acceptance job runs on every node and a retry adopts it; deletes are
idempotent; inventory lists the cluster's parts and only its own machines; users are added;
provider crusoe-cmk is refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from autoclusters.activities.cluster_provider import ClusterProviderActivities
from autoclusters.activities.cluster_providers.managed_slurm import CONTROLLER_FAILED
from autoclusters.activities.cluster_providers.registry import PROVIDER_UNAVAILABLE
from autoclusters.core.cluster import (
    QUOTA_EXCEEDED,
    AcceptanceCall,
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
from autoclusters.core.models import SlurmJob
from autoclusters.core.settings import Settings
from autoclusters.integrations.crusoe import CrusoeClient
from autoclusters.integrations.slurm import SlurmCli
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import InMemoryBackend
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.workers.remediation import cluster_provider
from tests.emulators.test_crusoe import Emulator, _client, _config
from tests.fakes.systems import FakeSlurm
from tests.helpers import eventually

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICvYBsl/DgCvGh/DMo+nY6kmlyPI24+sT5OvcdsYbW6Q alice@x"


class BatchSlurm(FakeSlurm):
    """FakeSlurm that also runs batch jobs: a job ends at once, COMPLETED on its nodes
    unless `fail_jobs`."""

    def __init__(self, *, fail_jobs: bool = False) -> None:
        super().__init__()
        self.fail_jobs = fail_jobs
        self.submitted: list[dict[str, Any]] = []

    async def submit_batch(
        self,
        command: str,
        *,
        name: str,
        partition: str,
        nodes: list[str],
        comment: str = "",
        output: str = "/dev/null",
    ) -> int:
        job_id = 100 + len(self.submitted)
        self.submitted.append({"command": command, "name": name, "partition": partition})
        self.add_job(
            job_id,
            nodes=",".join(nodes),
            name=name,
            job_state="FAILED" if self.fail_jobs else "COMPLETED",
        )
        return job_id

    async def job(self, job_id: int) -> SlurmJob | None:
        return next((j for j in await self.jobs() if j.job_id == job_id), None)


def _spec(name: str = "alpha", *, accounting: bool = True, count: int = 2) -> ClusterSpec:
    return ClusterSpec(
        name=name,
        provider="sandbox",
        location="us-east1-a",
        accounting=accounting,
        login={"count": 1, "ssh_public_keys": [KEY]},  # type: ignore[arg-type]
        shared_home={"size": "10Ti"},  # type: ignore[arg-type]
        node_sets=[
            NodeSetSpec(
                name="gpu", instance_type="h100-80gb-sxm-ib.8x", count=count, partition="batch"
            )
        ],
    )


def _ref(spec: ClusterSpec) -> ClusterRef:
    return ClusterRef(name=spec.name, provider=spec.provider, location=spec.location)


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    backend = InMemoryBackend()
    server = EmulatorServer(create_app(_config(), backend)).start()
    try:
        yield Emulator(server, backend)
    finally:
        server.stop()


@pytest_asyncio.fixture
async def crusoe(emulator: Emulator) -> AsyncIterator[CrusoeClient]:
    async with _client(emulator) as c:
        yield c


@pytest.fixture
def slurm_cli(sandbox: SandboxConfig) -> SlurmCli:
    return SlurmCli(sandbox.slurm_conf)


@pytest.fixture
def slurm() -> BatchSlurm:
    return BatchSlurm()


@pytest.fixture
def provider(crusoe: CrusoeClient, slurm: BatchSlurm) -> ClusterProviderActivities:
    return ClusterProviderActivities(
        crusoe, slurm, poll_s=0.02, register_timeout_s=0.5, acceptance_timeout_s=2
    )


def _run() -> Any:
    return ActivityEnvironment().run


def _clusters(emulator: Emulator) -> list[dict[str, Any]]:
    return list(emulator.admin("GET", "/state")["slurm_clusters"].values())


async def _machine(
    p: ClusterProviderActivities, spec: ClusterSpec, node: str, attempt: int = 1
) -> Machine:
    call = MachineCall(cluster=_ref(spec), node_set=spec.node_sets[0], node=node, attempt=attempt)
    machine: Machine = await _run()(p.create_machine, call)
    return machine


# --- the cluster ------------------------------------------------------------------------


async def test_the_controller_is_created_once_and_adopted_by_a_retry(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec = _spec()
    call = ProviderCall(cluster=_ref(spec), spec=spec)
    first = await _run()(provider.create_controller, call)
    again = await _run()(provider.create_controller, call)

    assert first == again
    assert first.kind == "controller" and first.name == "alpha"
    [cluster] = _clusters(emulator)
    assert cluster["id"] == first.id and cluster["state"] == "STATE_RUNNING"
    assert cluster["accounting_enabled"] is True
    assert cluster["root_ssh_pub_keys"] == [KEY]
    assert cluster["home_volume_size"] == "10240Gi"

    call = call.model_copy(update={"controller": first})
    accounting = await _run()(provider.create_accounting, call)
    home = await _run()(provider.create_shared_home, call)
    login = await _run()(provider.create_login_nodes, call)
    assert accounting == Resource(
        kind="accounting", id=f"{first.id}/accounting", name="alpha-slurmdbd"
    )
    assert home.kind == "shared_home" and home.id == f"{first.id}/home"
    assert login == Resource(kind="login", id=f"{first.id}/login", name="127.0.0.1:22")


async def test_an_existing_cluster_of_that_name_is_adopted_not_created_twice(
    emulator: Emulator, crusoe: CrusoeClient, provider: ClusterProviderActivities
) -> None:
    op = await crusoe.create_slurm_cluster({"name": "alpha", "location": "us-east1-a"})
    await crusoe.wait_operation(op, "slurm_cluster", poll_s=0.02)
    made = await _run()(
        provider.create_controller, ProviderCall(cluster=_ref(_spec()), spec=_spec())
    )
    [cluster] = _clusters(emulator)
    assert made.id == cluster["id"]


class BrokenClusters(InMemoryBackend):
    async def on_cluster_create(self, cluster: Any) -> Any:
        raise RuntimeError("munged is not running")


async def test_a_cluster_that_fails_is_reported_with_its_issue_and_deleted() -> None:
    with EmulatorServer(create_app(_config(), BrokenClusters())) as server:
        emulator = Emulator(server, InMemoryBackend())
        async with _client(emulator) as client:
            p = ClusterProviderActivities(client, BatchSlurm(), poll_s=0.02)
            spec = _spec()
            with pytest.raises(ApplicationError) as err:
                await _run()(p.create_controller, ProviderCall(cluster=_ref(spec), spec=spec))
        assert err.value.type == CONTROLLER_FAILED and err.value.non_retryable
        assert "munged is not running" in err.value.message
        assert _clusters(emulator) == []  # the name is free for the next try


async def test_a_create_operation_that_fails_is_retried_from_scratch(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    emulator.admin("POST", "/operation-failures", {"count": 1, "message": "internal error"})
    spec = _spec()
    call = ProviderCall(cluster=_ref(spec), spec=spec)
    with pytest.raises(ApplicationError) as err:
        await _run()(provider.create_controller, call)
    assert not err.value.non_retryable and "internal error" in err.value.message
    assert _clusters(emulator) == []
    made = await _run()(provider.create_controller, call)
    [cluster] = _clusters(emulator)
    assert cluster["id"] == made.id and cluster["state"] == "STATE_RUNNING"


# --- machines ---------------------------------------------------------------------------


async def test_a_quota_refusal_is_quota_exceeded_with_the_message_and_creates_nothing(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    emulator.admin("POST", "/quota", {"max_vms": 0})
    with pytest.raises(ApplicationError) as err:
        await _machine(provider, _spec(), "gpu-01")
    assert err.value.type == QUOTA_EXCEEDED and err.value.non_retryable
    assert err.value.message.startswith("quota exceeded: 0 VMs of 0 used in project")
    assert emulator.vms() == {}


async def test_a_retried_machine_create_adopts_its_vm(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec = _spec()
    first = await _machine(provider, spec, "gpu-01")
    again = await _machine(provider, spec, "gpu-01")
    assert first == again
    vm = emulator.vms()["gpu-01"]
    assert vm["id"] == first.machine_id and vm["type"] == "h100-80gb-sxm-ib.8x"
    assert vm["labels"]["autoclusters.cluster"] == "alpha"
    assert (await _run()(provider.wait_booted, first)).booted


async def test_a_failed_boot_is_not_booted_and_the_next_attempt_makes_a_new_vm(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec = _spec()
    emulator.admin("POST", "/boot-faults", {"name": "gpu-02", "mode": "fail", "count": 1})
    first = await _machine(provider, spec, "gpu-02")
    boot = await _run()(provider.wait_booted, first)
    assert not boot.booted and "failed to boot" in boot.detail

    await _run()(provider.delete, DeleteCall(cluster=_ref(spec), resource=first.resource()))
    second = await _machine(provider, spec, "gpu-02", attempt=2)
    assert second.machine_id != first.machine_id
    assert (await _run()(provider.wait_booted, second)).booted
    assert emulator.vms()["gpu-02"]["id"] == second.machine_id


async def test_a_hanging_boot_is_waited_on_heartbeating_until_cancelled(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    emulator.admin("POST", "/boot-faults", {"name": "gpu-01", "mode": "hang", "count": 1})
    machine = await _machine(provider, _spec(), "gpu-01")
    env, beats = ActivityEnvironment(), []
    env.on_heartbeat = lambda *d: beats.append(d)
    waiting = asyncio.ensure_future(env.run(provider.wait_booted, machine))
    await eventually(
        lambda: _async(emulator.vms()["gpu-01"]["state"] == "PROVISIONING" and len(beats) >= 2),
        timeout_s=10,
        what="a hanging boot, heartbeating",
    )
    assert not waiting.done()
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def _async(value: bool) -> bool:
    return value


async def test_deletes_are_idempotent(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec = _spec()
    controller = await _run()(
        provider.create_controller, ProviderCall(cluster=_ref(spec), spec=spec)
    )
    machine = await _machine(provider, spec, "gpu-01")
    for res in (machine.resource(), machine.resource(), controller, controller):
        await _run()(provider.delete, DeleteCall(cluster=_ref(spec), resource=res))
    # The parts that go with the cluster have nothing of their own to delete.
    home = Resource(kind="shared_home", id=f"{controller.id}/home", name="h")
    await _run()(provider.delete, DeleteCall(cluster=_ref(spec), resource=home))
    assert emulator.vms() == {}
    assert _clusters(emulator) == []


async def test_topology_comes_from_the_vms(provider: ClusterProviderActivities) -> None:
    spec = _spec(count=5)
    machines = [await _machine(provider, spec, f"gpu-0{i}") for i in range(1, 6)]
    ghost = machines[0].model_copy(update={"node": "gpu-09", "machine_id": "no-such-vm"})
    placed = await _run()(
        provider.discover_topology, TopologyCall(cluster=_ref(spec), machines=[*machines, ghost])
    )
    where = {p.node: (p.pod, p.leaf) for p in placed}
    assert where["gpu-01"] == where["gpu-04"] == ("pod-01", "leaf-01")
    assert where["gpu-05"] == ("pod-01", "leaf-02")
    assert where["gpu-09"] == (None, None)


# --- Slurm ------------------------------------------------------------------------------


async def test_configure_slurm_returns_the_nodes_that_registered(
    emulator: Emulator, provider: ClusterProviderActivities, slurm: BatchSlurm
) -> None:
    spec = _spec(count=4)
    await _run()(provider.create_controller, ProviderCall(cluster=_ref(spec), spec=spec))
    machines = [await _machine(provider, spec, f"gpu-0{i}") for i in range(1, 4)]
    machines.append(await _machine(provider, spec, "gpu-04"))
    now = int(time.time())
    slurm.add_node("gpu-01", slurmd_start_time=now)
    slurm.add_node(
        "gpu-02", state_flags=["DRAIN"], reason="autoclusters: new", slurmd_start_time=now
    )
    slurm.add_node("gpu-03", state="down", state_flags=["NOT_RESPONDING"], slurmd_start_time=now)
    # Answering, but from a slurmd older than its VM: the replaced machine's, not this one's.
    slurm.add_node("gpu-04", slurmd_start_time=now - 3600)
    nodes = [n.node for n in machines]
    call = SlurmConfigCall(
        cluster=_ref(spec),
        node_sets=[NodeSetNodes(name="gpu", partition="batch", gpus_per_node=8, nodes=nodes)],
        machines=machines,
        topology_conf="SwitchName=leaf-01 Nodes=gpu-[01-04]\n",
        accounting=True,
        drained={"gpu-02": "autoclusters: new"},
    )
    result = await _run()(provider.configure_slurm, call)
    assert result.registered == ["gpu-01", "gpu-02"]
    [cluster] = _clusters(emulator)
    assert cluster["configuration"]["drained"] == {"gpu-02": "autoclusters: new"}
    assert cluster["configuration"]["node_sets"][0]["nodes"] == nodes


async def test_the_acceptance_job_runs_on_every_node_and_a_retry_adopts_it(
    provider: ClusterProviderActivities, slurm: BatchSlurm
) -> None:
    spec = _spec()
    ns = NodeSetNodes(name="gpu", partition="batch", gpus_per_node=8, nodes=["gpu-01", "gpu-02"])
    call = AcceptanceCall(cluster=_ref(spec), node_set=ns)
    first = await _run()(provider.acceptance_job, call)
    again = await _run()(provider.acceptance_job, call)
    assert first.passed and first.nodes == ["gpu-01", "gpu-02"]
    assert again == first
    [job] = slurm.submitted
    assert job["command"] == "srun -N2 --ntasks-per-node=1 hostname"
    assert job["partition"] == "batch" and "test-run"[:8] in job["name"]


async def test_the_acceptance_job_runs_on_real_slurm(
    sandbox: SandboxConfig, slurm_cli: SlurmCli, crusoe: CrusoeClient
) -> None:
    """sbatch's arguments, and an ended job still listed by `squeue --json` (Slurm 22.05)."""
    p = ClusterProviderActivities(crusoe, slurm_cli, poll_s=0.5, acceptance_timeout_s=120)
    nodes = sandbox.node_names()[:2]
    ns = NodeSetNodes(name="gpu", partition="gpu", gpus_per_node=8, nodes=nodes)
    call = AcceptanceCall(cluster=_ref(_spec()), node_set=ns)
    result = await _run()(p.acceptance_job, call)
    assert result.passed, result.detail
    assert result.nodes == nodes and result.job_id is not None
    assert await _run()(p.acceptance_job, call) == result  # adopted, not run again


async def test_a_failed_acceptance_job_does_not_pass(crusoe: CrusoeClient) -> None:
    slurm = BatchSlurm(fail_jobs=True)
    p = ClusterProviderActivities(crusoe, slurm, poll_s=0.02)
    ns = NodeSetNodes(name="gpu", partition="batch", gpus_per_node=8, nodes=["gpu-01"])
    result = await _run()(p.acceptance_job, AcceptanceCall(cluster=_ref(_spec()), node_set=ns))
    assert not result.passed and "FAILED" in result.detail


async def test_users_are_added_to_the_cluster(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec = _spec()
    await _run()(provider.create_controller, ProviderCall(cluster=_ref(spec), spec=spec))
    users = [UserSpec(name="bob", ssh_public_keys=[KEY], slurm_account="ml")]
    done = await _run()(
        provider.add_users, UsersCall(cluster=_ref(spec), users=users, accounting=True)
    )
    assert done.added == ["bob"]
    [cluster] = _clusters(emulator)
    assert cluster["users"]["bob"]["slurm_account"] == "ml"


# --- inventory, refusals ------------------------------------------------------------------


async def test_inventory_lists_the_cluster_and_only_its_own_machines(
    emulator: Emulator, provider: ClusterProviderActivities
) -> None:
    spec, other = _spec(), _spec("beta")
    controller = await _run()(
        provider.create_controller, ProviderCall(cluster=_ref(spec), spec=spec)
    )
    mine = [await _machine(provider, spec, n) for n in ("gpu-02", "gpu-01")]
    other_set = other.model_copy(
        update={"node_sets": [other.node_sets[0].model_copy(update={"name": "cpu"})]}
    )
    await _machine(provider, other_set, "cpu-01")
    emulator.admin("POST", "/vms", {"vms": [{"name": "stray-01"}]})  # no labels: not ours

    inv = await _run()(provider.inventory, _ref(spec))
    assert [r.kind for r in inv.resources] == [
        "controller", "accounting", "shared_home", "login", "machine", "machine",
    ]  # fmt: skip
    assert inv.resources[0] == controller
    assert [m.node for m in inv.machines] == ["gpu-01", "gpu-02"]
    assert {m.machine_id for m in inv.machines} == {m.machine_id for m in mine}
    assert all(m.node_set == "gpu" for m in inv.machines)

    gone = await _run()(provider.inventory, _ref(_spec("gamma")))
    assert gone.resources == [] and gone.machines == []


async def test_crusoe_cmk_is_refused(provider: ClusterProviderActivities) -> None:
    spec = _spec().model_copy(update={"provider": "crusoe-cmk"})
    with pytest.raises(ApplicationError) as err:
        await _run()(provider.create_controller, ProviderCall(cluster=_ref(spec), spec=spec))
    assert err.value.type == PROVIDER_UNAVAILABLE and err.value.non_retryable
    with pytest.raises(ApplicationError) as err:
        await _run()(provider.inventory, _ref(spec))
    assert err.value.type == PROVIDER_UNAVAILABLE


def test_the_worker_registers_the_provider_only_with_crusoe_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("CRUSOE_ACCESS_KEY_ID", "CRUSOE_SECRET_KEY", "CRUSOE_DEFAULT_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings()
    assert cluster_provider(settings, BatchSlurm()) is None

    monkeypatch.setenv("CRUSOE_ACCESS_KEY_ID", "ak")
    monkeypatch.setenv("CRUSOE_SECRET_KEY", "c2VjcmV0")
    monkeypatch.setenv("CRUSOE_DEFAULT_PROJECT", "proj-1")
    monkeypatch.setenv("CRUSOE_API_ENDPOINT", "http://127.0.0.1:9/v1")
    provider = cluster_provider(settings, BatchSlurm())
    assert provider is not None
    names = {a.__temporal_activity_definition.name for a in provider.activities()}  # type: ignore[attr-defined]
    assert names == {
        f"cluster_{n}"
        for n in (
            "create_controller", "create_accounting", "create_shared_home",
            "create_login_nodes", "create_machine", "wait_booted", "discover_topology",
            "configure_slurm", "health_gate", "acceptance_job", "add_users", "delete",
            "inventory",
        )
    }  # fmt: skip
