"""`autoclusters cluster create|status|list|scale|delete` through the Typer app, against a
real Temporal dev server with a worker (in this process, on its own thread and event loop)
running ClusterProvisioning, ScaleNodeSet and ClusterTeardown over the in-memory provider
(tests/fakes/ops.py) and a FakeSlurm.

Aspects covered:
- create follows the provisioning to ready (exit 0) printing the UI link and the per node
  set progress; status --json parses into the cluster's state; list shows the cluster;
  scale and delete start their workflows (and, waited on, end done); a second create of a
  ready cluster is refused;
- a provider that refuses for quota: create exits 1 with the provider's message;
- a spec that does not validate: exit 2, no workflow started;
- an unknown cluster: status, scale and delete exit 1 and start nothing.

The CLI reads its settings from AUTOCLUSTERS_*; each test points them at this server and at
the task queue of the provider it wants (one that works, one out of quota).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker
from typer.testing import CliRunner

from autoclusters.activities.cluster_ops import ClusterOpsActivities
from autoclusters.activities.guard import GuardActivities
from autoclusters.activities.slurm import SlurmActivities
from autoclusters.clients.cli.app import app
from autoclusters.core.cluster import (
    BootResult,
    ClusterState,
    Machine,
    provisioning_workflow_id,
)
from autoclusters.core.cluster_ops import ops_workflow_id
from autoclusters.workflows.cluster_ops import ClusterTeardown, ScaleNodeSet
from autoclusters.workflows.cluster_provisioning import ClusterProvisioning
from autoclusters.workflows.fleet_guard import FleetGuard
from tests.dev_server_thread import call_on, dev_server_thread
from tests.fakes.ops import OpsProvider
from tests.fakes.provider import QUOTA_MESSAGE
from tests.fakes.systems import FakeSlurm

pytestmark = pytest.mark.integration  # a Temporal dev server

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICvYBsl/DgCvGh/DMo+nY6kmlyPI24+sT5OvcdsYbW6Q alice@x"
QUEUES = ("ok", "quota", "held")


class HeldProvider(OpsProvider):
    """Machines boot only once the test releases them: the provisioning stays running."""

    def __init__(self, slurm: FakeSlurm) -> None:
        super().__init__(slurm)
        self.released = asyncio.Event()  # set on the server thread's loop

    @activity.defn(name="cluster_wait_booted")
    async def wait_booted(self, machine: Machine) -> BootResult:
        while not self.released.is_set():
            activity.heartbeat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.released.wait(), 1)
        return await OpsProvider.wait_booted(self, machine)


@dataclass
class Server:
    address: str
    queues: dict[str, str]  # provider's role -> its task queue
    providers: dict[str, OpsProvider]
    loop: asyncio.AbstractEventLoop

    def call(self, coro: Any) -> Any:
        return call_on(self.loop, coro)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """One dev server and one worker per provider for the module, on a thread of their own:
    the CLI under test runs its own `asyncio.run`, which cannot nest in a running loop."""

    @asynccontextmanager
    async def serve(client: Client) -> AsyncIterator[Server]:
        providers = {
            "ok": OpsProvider(FakeSlurm()),
            # Two machines allowed: the third of a four-node set is refused for quota.
            "quota": OpsProvider(FakeSlurm(), machines_allowed=2),
            "held": HeldProvider(FakeSlurm()),
        }
        queues = {role: f"cli-{role}-{uuid.uuid4().hex[:6]}" for role in QUEUES}
        async with AsyncExitStack() as workers:
            for role in QUEUES:
                await workers.enter_async_context(_worker(client, queues[role], providers[role]))
            yield Server(
                address=client.service_client.config.target_host,
                queues=queues,
                providers=providers,
                loop=asyncio.get_running_loop(),
            )

    with dev_server_thread(serve) as srv:
        yield srv


def _worker(client: Client, queue: str, provider: OpsProvider) -> Worker:
    slurm = provider.slurm
    s = SlurmActivities(slurm)
    ops = ClusterOpsActivities(client, slurm)
    guard = GuardActivities(client, slurm, queue, execution_timeout=timedelta(minutes=10))
    return Worker(
        client,
        task_queue=queue,
        workflows=[ClusterProvisioning, FleetGuard, ScaleNodeSet, ClusterTeardown],
        activities=[
            *provider.activities(),
            guard.attach_policy,
            s.drain_node,
            s.requeue_jobs,
            s.wait_node_idle,
            s.return_to_service,
            ops.node_load,
            ops.incident_open,
            ops.workflow_running,
        ],
    )


@pytest.fixture
def cli(server: Server, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`cli(role, *args)`: the app invoked with its settings on this server and that role's
    task queue."""
    runner = CliRunner()

    def invoke(role: str, *args: str, input: str | None = None) -> Any:
        monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__ADDRESS", server.address)
        monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__TASK_QUEUE", server.queues[role])
        monkeypatch.setenv("AUTOCLUSTERS_TEMPORAL__UI_URL", "http://ui.test:8233")
        return runner.invoke(app, ["cluster", *args], input=input)

    return invoke


def spec_file(tmp_path: Path, name: str, gpus: int = 2, extra: str = "") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        f"""\
name: {name}
provider: sandbox
location: local
accounting: true
login: {{count: 1, ssh_public_keys: ["{KEY}"]}}
shared_home: {{size: 10Gi}}
node_sets:
  - {{name: gpu, instance_type: h100-80gb-sxm-ib.8x, count: {gpus}, partition: gpu}}
users:
  - {{name: alice, ssh_public_keys: ["{KEY}"], slurm_account: research}}
{extra}"""
    )
    return path


def _name() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


async def _exists(client_of: Server, wf_id: str) -> bool:
    client = await Client.connect(client_of.address, data_converter=pydantic_data_converter)
    try:
        await client.get_workflow_handle(wf_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


def test_create_status_list_scale_delete(cli: Any, server: Server, tmp_path: Path) -> None:
    name = _name()
    spec = spec_file(tmp_path, name)

    out = cli("ok", "create", "-f", str(spec), "--no-agent-gate")
    assert out.exit_code == 0, out.output
    wf_id = provisioning_workflow_id(name)
    assert f"Temporal UI: http://ui.test:8233/namespaces/default/workflows/{wf_id}" in out.output
    assert "gpu: 2 requested, 2 booted, 2 registered, 2 healthy" in out.output
    assert f"cluster {name} is ready" in out.output

    out = cli("ok", "status", name, "--json")
    assert out.exit_code == 0, out.output
    view = json.loads(out.stdout)
    state = ClusterState.model_validate(view["state"])
    assert state.status == "ready" and view["temporal_status"] == "completed"
    assert state.progress["gpu"].healthy == 2
    assert [a["passed"] for a in view["state"]["acceptance"]] == [True]
    assert view["ops"] is None and view["deleted"] is False

    out = cli("ok", "status", name)
    assert out.exit_code == 0, out.output
    assert "no scale or teardown has run" in out.output

    # Visibility is eventually consistent: the list is asked again until it shows the cluster.
    for _ in range(50):
        out = cli("ok", "list", "--json")
        assert out.exit_code == 0, out.output
        rows = {r["name"]: r for r in json.loads(out.stdout)}
        if name in rows:
            break
    assert rows[name]["provider"] == "sandbox" and rows[name]["status"] == "ready"

    # Already ready: a second create starts nothing.
    out = cli("ok", "create", "-f", str(spec), "--no-agent-gate")
    assert out.exit_code == 1 and f"cluster {name} exists" in out.output

    out = cli("ok", "scale", name, "gpu", "3", "--wait")
    assert out.exit_code == 0, out.output
    assert f"ScaleNodeSet {ops_workflow_id(name)}" in out.output
    assert "ScaleNodeSet: done; added gpu-03" in out.output
    assert "gpu-03" in {m.node for m in server.providers["ok"].machines.values()}

    out = cli("ok", "scale", name, "nope", "1")
    assert out.exit_code == 1 and "has no node set 'nope'" in out.output

    out = cli("ok", "delete", name, input="n\n")
    assert out.exit_code != 0  # not confirmed: aborted, nothing started
    out = cli("ok", "delete", name, "--yes", "--wait")
    assert out.exit_code == 0, out.output
    assert "ClusterTeardown: done" in out.output
    assert not [r for r in server.providers["ok"].alive.values()]

    out = cli("ok", "status", name, "--json")
    view = json.loads(out.stdout)
    assert view["deleted"] is True and view["ops"]["workflow_type"] == "ClusterTeardown"


def test_a_running_provisioning_is_attached_to_and_not_scaled(
    cli: Any, server: Server, tmp_path: Path
) -> None:
    name = _name()
    spec = spec_file(tmp_path, name)
    held = server.providers["held"]
    assert isinstance(held, HeldProvider)
    try:
        out = cli("held", "create", "-f", str(spec), "--no-wait", "--no-agent-gate")
        assert out.exit_code == 0, out.output
        assert f"provisioning cluster {name}" in out.output

        out = cli("held", "create", "-f", str(spec), "--no-wait", "--json", "--no-agent-gate")
        assert out.exit_code == 0, out.output
        assert json.loads(out.stdout)["attached"] is True
        assert "already being provisioned: following" in out.output

        for _ in range(50):  # until the workflow waits on the boots (each ask takes a query)
            view = json.loads(cli("held", "status", name, "--json").stdout)
            if view["state"] and view["state"]["current_step"] == "boot_machines":
                break
        assert view["temporal_status"] == "running"
        assert view["state"]["progress"]["gpu"] == {
            "requested": 2, "booted": 0, "registered": 0, "healthy": 0, "replaced": 0
        }  # fmt: skip

        for args in (["scale", name, "gpu", "3"], ["delete", name, "--yes"]):
            out = cli("held", *args)
            assert out.exit_code == 1, out.output
            assert "still being provisioned" in out.output
        assert not server.call(_exists(server, ops_workflow_id(name)))
    finally:
        server.loop.call_soon_threadsafe(held.released.set)
    for _ in range(50):  # released: the provisioning goes on to ready
        view = json.loads(cli("held", "status", name, "--json").stdout)
        if view["temporal_status"] != "running":
            break
    assert view["temporal_status"] == "completed" and view["state"]["status"] == "ready"


def test_create_refused_for_quota_exits_1_with_the_message(cli: Any, tmp_path: Path) -> None:
    name = _name()
    out = cli("quota", "create", "-f", str(spec_file(tmp_path, name, gpus=4)), "--no-agent-gate")
    assert out.exit_code == 1, out.output
    assert f"cluster {name} failed: {QUOTA_MESSAGE}" in " ".join(out.output.split())


def test_a_bad_spec_exits_2_and_starts_nothing(cli: Any, server: Server, tmp_path: Path) -> None:
    name = _name()
    bad = spec_file(tmp_path, name, extra="keep_on_failure: maybe\n")
    out = cli("ok", "create", "-f", str(bad))
    assert out.exit_code == 2
    assert "keep_on_failure" in out.output
    assert not server.call(_exists(server, provisioning_workflow_id(name)))


def test_an_unknown_cluster_exits_1_and_starts_nothing(cli: Any, server: Server) -> None:
    name = _name()
    for args in (["status", name], ["scale", name, "gpu", "2"], ["delete", name, "--yes"]):
        out = cli("ok", *args)
        assert out.exit_code == 1, (args, out.output)
        assert f"no cluster {name}" in out.output
    assert not server.call(_exists(server, ops_workflow_id(name)))


def test_the_live_display_redraws_on_a_terminal_and_keeps_brackets() -> None:
    import io

    from rich.console import Console

    from autoclusters.clients.cluster_progress import progress_for

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=120)
    state = ClusterState(
        cluster="c1", provider="sandbox", node_sets={"gpu": ["gpu-01", "gpu-02"]},
        nodes={"gpu-01": "healthy", "gpu-02": "booted"}, current_step="register_and_gate",
    )  # fmt: skip
    with progress_for(console, "c1") as progress:
        progress.show(None)
        progress.show(state)
        progress.show(state.model_copy(update={"status": "failed", "failure": "node_sets[0]"}))
    text = buf.getvalue()
    assert "waiting for a worker" in text
    assert "register with slurmctld" in text
    assert "node_sets[0]" in text  # a failure is text, never read as markup
