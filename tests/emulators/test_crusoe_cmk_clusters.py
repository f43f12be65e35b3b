"""CMK clusters on the Crusoe emulator (`/v1/projects/{pid}/kubernetes/clusters`), driven by
the product's CrusoeClient over a real loopback socket.

Aspects: a create answers with an operation, polled on the clusters' own operations path,
after which the cluster runs with the add-ons asked for (and is listed, with seeded ones);
while an operation runs the cluster is busy (409) and not yet usable; a failed create leaves
it STATE_FAILED; a taken name is 409 and not retried; a bad body is 400 naming the field
and makes nothing; unknown ids are 404; an unsigned or forged request is 401 and changes
nothing; PATCH changes the control plane's arguments, never the add-ons; delete removes the
cluster, refused while it has node pools; get-credentials hands out the emulator's
kubeconfig, which a Kubernetes client then uses, and without one answers 404 saying why; a
state file from before clusters had these fields loads; `--kubeconfig` reaches the emulator
from its command line and from the sandbox's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from kubernetes import client as k8s

from autoclusters.integrations.crusoe import (
    CrusoeClient,
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeRequestError,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.signing import format_timestamp, sign
from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.crusoe import cloud_api
from autoclusters.sandbox.crusoe import emulator as crusoe_emulator
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import InMemoryBackend
from autoclusters.sandbox.kubernetes import tls as k8s_tls
from autoclusters.sandbox.kubernetes.emulator import running
from autoclusters.sandbox.runtime.config import SandboxConfig
from tests import loopback
from tests.emulators.test_crusoe import KEY_ID, PROJECT, SECRET, Emulator, _client, _config

CLUSTERS = f"/v1/projects/{PROJECT}/kubernetes/clusters"
SPEC: dict[str, Any] = {
    "name": "train",
    "location": "us-east1-a",
    "version": "1.31.7-cmk.7",
    "add_ons": ["crusoe_csi", "slurm_operator"],
}

Start = Callable[..., Emulator]


@pytest.fixture
def start() -> Iterator[Start]:
    """Starts emulators (`_config` overrides as keywords); stops them after the test."""
    servers: list[EmulatorServer] = []

    def _start(**overrides: Any) -> Emulator:
        backend = InMemoryBackend()
        server = EmulatorServer(create_app(_config(**overrides), backend)).start()
        servers.append(server)
        return Emulator(server, backend)

    yield _start
    for server in servers:
        server.stop()


@pytest.fixture
def emulator(start: Start) -> Emulator:
    return start()


@pytest_asyncio.fixture
async def crusoe(emulator: Emulator) -> AsyncIterator[CrusoeClient]:
    async with _client(emulator) as c:
        yield c


def _clusters(emulator: Emulator) -> dict[str, dict[str, Any]]:
    """The emulator's world: cluster id -> cluster."""
    clusters: dict[str, dict[str, Any]] = emulator.admin("GET", "/state")["clusters"]
    return clusters


def _signed(emulator: Emulator, method: str, path: str, content: bytes = b"") -> httpx.Response:
    """A correctly signed request with a raw body (what CrusoeClient would never send)."""
    headers = sign(
        method=method,
        path=path,
        query="",
        timestamp=format_timestamp(datetime.now(UTC)),
        access_key_id=KEY_ID,
        secret_key=SECRET,
    )
    return loopback.request(
        method,
        emulator.server.url + path,
        headers={**headers, "Content-Type": "application/json"},
        content=content,
    )


async def _create(crusoe: CrusoeClient, **changes: Any) -> str:
    """A running cluster of SPEC (with `changes`); its id."""
    op = await crusoe.create_kubernetes_cluster({**SPEC, **changes})
    done = await crusoe.wait_operation(op, "kubernetes_cluster", poll_s=0.02)
    return str(done.metadata["cluster_id"])


# --- create, operations, get, list -----------------------------------------------------------


async def test_a_create_is_an_operation_after_which_the_cluster_runs(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    op = await crusoe.create_kubernetes_cluster(SPEC)
    assert op.state == "IN_PROGRESS" and op.metadata["action"] == "CREATE"
    cid = op.metadata["cluster_id"]

    done = await crusoe.wait_operation(op, "kubernetes_cluster", poll_s=0.02)
    assert done.state == "SUCCEEDED" and done.completed_at
    polled = {r["path"] for r in emulator.requests(method="GET")}
    assert f"{CLUSTERS}/operations/{op.operation_id}" in polled

    cluster = await crusoe.get_kubernetes_cluster(cid)
    assert (cluster.id, cluster.name, cluster.state) == (cid, "train", "STATE_RUNNING")
    assert (cluster.location, cluster.version) == ("us-east1-a", "1.31.7-cmk.7")
    assert cluster.add_ons == ["crusoe_csi", "slurm_operator"]  # AutoClusters not asked for
    assert cluster.node_pools == [] and cluster.created_at
    assert (cluster.model_extra or {})["project_id"] == PROJECT

    # The clusters' operations list names it; the node pools' does not.
    listed = await crusoe.list_operations("kubernetes_cluster", resource_id=cid)
    assert [o.operation_id for o in listed] == [op.operation_id]
    assert await crusoe.list_operations("node_pool") == []


async def test_the_list_holds_seeded_and_created_clusters_in_creation_order(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    # A seed gives only what it knows: the cluster runs, with AutoClusters on, in the project.
    emulator.admin("POST", "/vms", {"clusters": [{"id": "cmk-seeded", "name": "seeded"}]})
    first = await _create(crusoe)
    second = await _create(crusoe, name="infer", add_ons=["autoclusters"])
    emulator.admin(
        "POST",
        "/vms",
        {"node_pools": [{"id": "np-1", "name": "h100", "cluster_id": second}]},
    )

    listed = await crusoe.list_kubernetes_clusters()
    assert [c.id for c in listed] == ["cmk-seeded", first, second]
    seeded = listed[0]
    assert seeded.state == "STATE_RUNNING" and seeded.add_ons == ["autoclusters"]
    assert (seeded.model_extra or {})["project_id"] == PROJECT
    assert listed[2].node_pools == ["np-1"]
    assert _clusters(emulator)[second]["autoclusters"] is True  # the add-on is the flag


async def test_a_cluster_is_busy_and_not_usable_while_its_create_runs(start: Start) -> None:
    emulator = start(operation_s=60)  # the create stays in flight for the whole test
    async with _client(emulator, max_attempts=1) as crusoe:
        op = await crusoe.create_kubernetes_cluster(SPEC)
        cid = op.metadata["cluster_id"]
        assert (await crusoe.get_kubernetes_cluster(cid)).state == "STATE_PROVISIONING"
        for attempt in (crusoe.delete_kubernetes_cluster, crusoe.get_kubernetes_credentials):
            with pytest.raises(CrusoeUnavailable) as err:
                await attempt(cid)
            assert err.value.status == 409
        assert op.operation_id in str(_signed(emulator, "PATCH", f"{CLUSTERS}/{cid}").json())
        assert cid in _clusters(emulator)  # the delete changed nothing


async def test_a_failed_create_leaves_the_cluster_failed(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    emulator.admin("POST", "/operation-failures", {"message": "no capacity for the control plane"})
    op = await crusoe.create_kubernetes_cluster(SPEC)
    with pytest.raises(CrusoeOperationFailed, match="no capacity for the control plane"):
        await crusoe.wait_operation(op, "kubernetes_cluster", poll_s=0.02)
    cluster = await crusoe.get_kubernetes_cluster(op.metadata["cluster_id"])
    assert cluster.state == "STATE_FAILED"


# --- refusals ------------------------------------------------------------------------------


async def test_a_taken_name_is_409_and_not_retried(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    cid = await _create(crusoe)
    emulator.admin("DELETE", "/requests")
    with pytest.raises(CrusoeUnavailable) as err:
        await crusoe.create_kubernetes_cluster({**SPEC, "add_ons": []})
    assert err.value.status == 409
    assert "a Kubernetes cluster named train already exists" in str(err.value)
    assert cid in str(err.value)
    assert len(emulator.requests(CLUSTERS, "POST")) == 1
    assert list(_clusters(emulator)) == [cid]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in SPEC.items() if k != "name"}, "name: Field required"),
        ({**SPEC, "name": "Train_1"}, "name: String should match pattern"),
        ({k: v for k, v in SPEC.items() if k != "version"}, "version: Field required"),
        ({**SPEC, "location": ""}, "location: String should have at least 1 character"),
        ({**SPEC, "add_ons": ["crusoe_csi", "slurm-operator"]}, "add_ons: "),
        ({**SPEC, "add_ons": "slurm_operator"}, "add_ons: Input should be a valid list"),
        ({**SPEC, "apiserver_extra_args": {"v": 2}}, "apiserver_extra_args.v: "),
    ],
    ids=["no-name", "bad-name", "no-version", "empty-location", "unknown-add-on",
         "add-ons-not-a-list", "args-not-strings"],
)  # fmt: skip
async def test_a_bad_body_is_400_naming_the_field_and_makes_nothing(
    emulator: Emulator, crusoe: CrusoeClient, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(CrusoeRequestError) as err:
        await crusoe.create_kubernetes_cluster(body)
    assert err.value.status == 400 and err.value.non_retryable
    assert err.value.message.startswith(field), err.value.message
    if "slurm-operator" in str(body):
        assert "unknown add-on 'slurm-operator'" in err.value.message
    assert _clusters(emulator) == {}


def test_a_body_that_is_not_json_is_400(emulator: Emulator) -> None:
    resp = _signed(emulator, "POST", CLUSTERS, b"{name: train")
    assert resp.status_code == 400 and resp.json()["message"] == "the request body is not JSON"
    assert _clusters(emulator) == {}


async def test_unknown_ids_are_404(emulator: Emulator, crusoe: CrusoeClient) -> None:
    for call in (
        crusoe.get_kubernetes_cluster("no-such"),
        crusoe.delete_kubernetes_cluster("no-such"),
        crusoe.get_kubernetes_credentials("no-such"),
        crusoe.get_operation("no-such", "kubernetes_cluster"),
    ):
        with pytest.raises(CrusoeNotFound) as err:
            await call
        assert "no-such not found" in err.value.message
    assert _signed(emulator, "PATCH", f"{CLUSTERS}/no-such", b"{}").status_code == 404

    # Another API family's operation is not the clusters' to show.
    emulator.admin("POST", "/vms", {"vms": [{"name": "gpu-01"}]})
    op = await crusoe.patch_vm_action(emulator.vm_id("gpu-01"), "RESET")
    with pytest.raises(CrusoeNotFound):
        await crusoe.get_operation(op.operation_id, "kubernetes_cluster")
    # So is another project's cluster list.
    other = _signed(emulator, "GET", "/v1/projects/proj-2/kubernetes/clusters")
    assert other.status_code == 404


async def test_an_unsigned_or_forged_request_is_401_and_changes_nothing(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    cid = await _create(crusoe)
    before = _clusters(emulator)
    url = emulator.server.url + CLUSTERS
    other = {**SPEC, "name": "other"}

    unsigned = loopback.post(url, json=other)
    assert unsigned.status_code == 401
    # A real signature, for another request (a read of the list), replayed on a create.
    read = sign(
        method="GET",
        path=CLUSTERS,
        query="",
        timestamp=format_timestamp(datetime.now(UTC)),
        access_key_id=KEY_ID,
        secret_key=SECRET,
    )
    replayed = loopback.post(url, headers=read, json=other)
    assert replayed.status_code == 401
    assert "signature does not match" in replayed.json()["message"]
    async with _client(emulator, secret=SECRET[::-1]) as wrong_key:
        with pytest.raises(CrusoeRequestError) as err:
            await wrong_key.delete_kubernetes_cluster(cid)
    assert err.value.status == 401 and err.value.non_retryable

    assert _clusters(emulator) == before  # no cluster "other", none deleted
    assert await crusoe.list_operations("kubernetes_cluster", resource_id=cid) != []
    assert [o.metadata["action"] for o in await crusoe.list_operations("kubernetes_cluster")] == [
        "CREATE"
    ]


# --- PATCH and delete ----------------------------------------------------------------------


async def test_patch_changes_the_control_plane_arguments_and_never_the_add_ons(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    cid = await _create(crusoe, apiserver_extra_args={"v": "2"}, scheduler_extra_args={"a": "b"})
    body = json.dumps({"apiserver_extra_args": {"v": "4"}, "scheduler_extra_args": {}})
    resp = _signed(emulator, "PATCH", f"{CLUSTERS}/{cid}", body.encode())
    assert resp.status_code == 200
    op = resp.json()["operation"]
    assert op["metadata"] == {"cluster_id": cid, "action": "UPDATE"}
    await crusoe.wait_operation(
        await crusoe.get_operation(op["operation_id"], "kubernetes_cluster"),
        "kubernetes_cluster",
        poll_s=0.02,
    )
    cluster = (await crusoe.get_kubernetes_cluster(cid)).model_extra or {}
    assert cluster["apiserver_extra_args"] == {"v": "4"}
    assert cluster["scheduler_extra_args"] == {}  # given empty: cleared
    assert cluster["updated_at"]

    add = json.dumps({"add_ons": ["slurm_operator", "autoclusters"]}).encode()
    refused = _signed(emulator, "PATCH", f"{CLUSTERS}/{cid}", add)
    assert refused.status_code == 400
    assert "add_ons cannot be changed through PATCH" in refused.json()["message"]
    assert (await crusoe.get_kubernetes_cluster(cid)).add_ons == ["crusoe_csi", "slurm_operator"]


async def test_delete_removes_the_cluster_and_is_refused_while_it_has_node_pools(
    emulator: Emulator, crusoe: CrusoeClient
) -> None:
    cid = await _create(crusoe)
    emulator.admin(
        "POST", "/vms", {"node_pools": [{"id": "np-1", "name": "h100", "cluster_id": cid}]}
    )
    with pytest.raises(CrusoeUnavailable) as err:  # 409: the client retried, then gave up
        await crusoe.delete_kubernetes_cluster(cid)
    assert err.value.status == 409 and "still has node pools (h100)" in str(err.value)
    assert (await crusoe.get_kubernetes_cluster(cid)).state == "STATE_RUNNING"

    pool_op = await crusoe.delete_node_pool("np-1")
    await crusoe.wait_operation(pool_op, "node_pool", poll_s=0.02)
    op = await crusoe.delete_kubernetes_cluster(cid)
    assert op.metadata == {"cluster_id": cid, "action": "DELETE"}
    await crusoe.wait_operation(op, "kubernetes_cluster", poll_s=0.02)
    with pytest.raises(CrusoeNotFound):
        await crusoe.get_kubernetes_cluster(cid)
    assert await crusoe.list_kubernetes_clusters() == []


# --- get-credentials ---------------------------------------------------------------------------


async def test_get_credentials_hands_out_a_kubeconfig_a_client_uses(
    start: Start, tmp_path: Path
) -> None:
    with running("cmk-token", tls=True) as kube:
        # What the sandbox writes for every client: HTTPS and its CA.
        path = tmp_path / "kubeconfig"
        path.write_text(k8s_tls.kubeconfig(kube.url, "cmk-token", kube.ca_pem))
        emulator = start(kubeconfig=path)
        async with _client(emulator) as crusoe:
            cid = await _create(crusoe)
            creds = await crusoe.get_kubernetes_credentials(cid)
        assert creds.kube_config == path.read_text()
        assert creds.cluster_name == "train" and creds.cluster_address == kube.url
        assert creds.cluster_ca_certificate == kube.ca_pem

        handed = tmp_path / "handed.kubeconfig"
        handed.write_text(creds.kube_config)
        api = api_client(kubeconfig=handed)
        try:
            namespaces = k8s.CoreV1Api(api).list_namespace()
        finally:
            api.close()
        assert "default" in {ns.metadata.name for ns in namespaces.items}


async def test_get_credentials_without_a_kubeconfig_says_why(
    start: Start, crusoe: CrusoeClient, tmp_path: Path
) -> None:
    cid = await _create(crusoe)
    with pytest.raises(CrusoeNotFound) as err:
        await crusoe.get_kubernetes_credentials(cid)
    assert "started without --kubeconfig" in err.value.message and cid in err.value.message

    # Told one that is not written yet (the Kubernetes emulator starts later): 409, retried.
    later = start(kubeconfig=tmp_path / "not-yet.kubeconfig")
    async with _client(later, max_attempts=2) as c:
        cid = await _create(c)
        with pytest.raises(CrusoeUnavailable) as busy:
            await c.get_kubernetes_credentials(cid)
        assert busy.value.status == 409 and "cannot be read yet" in str(busy.value)
        (tmp_path / "not-yet.kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
        assert (await c.get_kubernetes_credentials(cid)).kube_config.startswith("apiVersion")
    assert len(later.requests(f"{CLUSTERS}/{cid}/get-credentials", "POST")) == 3


# --- the world and the command line ------------------------------------------------------------


async def test_a_state_file_from_before_cmk_clusters_had_their_fields_loads(
    tmp_path: Path, start: Start
) -> None:
    state = tmp_path / "crusoe.json"
    state.write_text(
        json.dumps(
            {
                "vms": {},
                "pools": {},
                "clusters": {
                    "cmk-old": {"id": "cmk-old", "name": "training", "autoclusters": True}
                },
                "operations": {},
            }
        )
    )
    emulator = start(state_file=state)
    async with _client(emulator) as crusoe:
        old = await crusoe.get_kubernetes_cluster("cmk-old")
        assert (old.name, old.state, old.version) == ("training", "STATE_RUNNING", "1.31.7-cmk.7")
        assert old.add_ons == ["autoclusters"]
        await _create(crusoe)  # the next save writes the new fields
    saved = json.loads(state.read_text())["clusters"]["cmk-old"]
    assert saved["state"] == "STATE_RUNNING" and saved["add_ons"] == ["autoclusters"]


def test_kubeconfig_reaches_the_emulator_from_the_sandbox_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRUSOE_SECRET_KEY", SECRET)
    served: list[Any] = []
    monkeypatch.setattr(crusoe_emulator, "serve", lambda app, **_: served.append(app))
    monkeypatch.setattr(crusoe_emulator, "_load_backend", lambda *_: InMemoryBackend())
    for k8s_mode in (True, False):
        cfg = SandboxConfig(state_dir=tmp_path, cluster="c", nodes=2, port_base=20000, k8s=k8s_mode)
        argv = cloud_api.crusoe_emulator_argv(cfg)
        crusoe_emulator.main(argv[argv.index("autoclusters.sandbox.crusoe.emulator") + 1 :])
    with_k8s, without = (app.state.engine.config.kubeconfig for app in served)
    assert with_k8s == tmp_path / "k8s" / "kubeconfig" and without is None
