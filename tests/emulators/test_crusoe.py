"""The Crusoe client and provider against the emulator, over a real loopback socket.

Aspects: requests with a bad signature or a timestamp outside the window (stale or from the
future) get 401 and change nothing; 409/429/5xx are retried (Retry-After honoured, a create
only where the API cannot have acted) and other 4xx are not, the API's message in the error;
operations are polled to SUCCEEDED, a FAILED one raises its message, a busy VM answers 409;
the provider resets in place and replaces through AutoClusters remediation, a node-pool
delete, or a recreate, each giving a new VM id under the same name; a retry (any worker,
no disk) resumes the operation in its heartbeat details, adopts the one a lost heartbeat
forgot from the API's operation list, and never touches a VM other than the recorded one;
the secret never shows in a repr, a str, an error or the logs
(credentials loading: test_crusoe_credentials.py); the emulator's command line and state file work.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from pydantic import SecretStr

from autoclusters.core.policy import Rung
from autoclusters.integrations.crusoe import (
    CrusoeAuth,
    CrusoeClient,
    CrusoeCloud,
    CrusoeCredentials,
    CrusoeNotFound,
    CrusoeOperationFailed,
    CrusoeRequestError,
    CrusoeUnavailable,
)
from autoclusters.integrations.crusoe.signing import format_timestamp, sign
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import EmulatorConfig, InMemoryBackend
from tests import loopback
from tests.helpers import eventually

SECRET = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
KEY_ID = "ak-test"
PROJECT = "proj-1"
CLUSTER = "cmk-1"
POOL = "np-1"
VMS = f"/v1/projects/{PROJECT}/compute/vms/instances"


@dataclass
class Emulator:
    server: EmulatorServer
    backend: InMemoryBackend

    @property
    def endpoint(self) -> str:
        return self.server.url + "/v1"

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        resp = loopback.request(method, f"{self.server.url}/_emulator{path}", json=body)
        resp.raise_for_status()
        return resp.json()

    def inject(self, **rule: Any) -> None:
        self.admin("POST", "/inject", rule)

    def requests(self, path: str | None = None, method: str | None = None) -> list[dict[str, Any]]:
        return [
            r
            for r in self.admin("GET", "/requests")
            if (path is None or r["path"] == path) and (method is None or r["method"] == method)
        ]

    def vms(self) -> dict[str, dict[str, Any]]:
        """VM name -> VM."""
        return {vm["name"]: vm for vm in self.admin("GET", "/state")["vms"].values()}

    def vm_id(self, name: str) -> str:
        return str(self.vms()[name]["id"])


def _config(**overrides: Any) -> EmulatorConfig:
    base: dict[str, Any] = dict(
        access_key_id=KEY_ID,
        secret_key=SecretStr(SECRET),
        project_id=PROJECT,
        operation_s=0.05,
        boot_delay_s=0.1,
    )
    return EmulatorConfig(**(base | overrides))


SEED = {
    "clusters": [{"id": CLUSTER, "name": "training"}],
    "node_pools": [{"id": POOL, "name": "h100", "cluster_id": CLUSTER}],
    "vms": [
        {"name": "gpu-01", "node_pool_id": POOL, "image": "ubuntu22.04-nvidia"},
        {"name": "gpu-02", "node_pool_id": POOL},
        {"name": "gpu-03", "image": "ubuntu22.04-nvidia"},  # in no pool
    ],
}


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    backend = InMemoryBackend()
    server = EmulatorServer(create_app(_config(), backend)).start()
    emu = Emulator(server, backend)
    try:
        emu.admin("POST", "/vms", SEED)
        emu.admin("DELETE", "/requests")
        yield emu
    finally:
        server.stop()
    assert not server.running, "the emulator thread outlived the test"


def _credentials(endpoint: str, secret: str = SECRET) -> CrusoeCredentials:
    return CrusoeCredentials(
        access_key_id=KEY_ID,
        secret_key=SecretStr(secret),
        api_endpoint=endpoint,
        default_project=PROJECT,
    )


def _client(emulator: Emulator, *, secret: str = SECRET, max_attempts: int = 4) -> CrusoeClient:
    return CrusoeClient(
        credentials=_credentials(emulator.endpoint, secret),
        max_attempts=max_attempts,
        backoff_s=0.01,
        max_backoff_s=0.05,
        poll_s=0.02,
        timeout_s=10,
    )


@pytest_asyncio.fixture
async def client(emulator: Emulator) -> AsyncIterator[CrusoeClient]:
    async with _client(emulator) as c:
        yield c


def _cloud(client: CrusoeClient, **kwargs: Any) -> CrusoeCloud:
    return CrusoeCloud(client, poll_s=0.02, replace_timeout_s=20, operation_timeout_s=20, **kwargs)


# --- authentication ---------------------------------------------------------------------


async def test_a_bad_signature_gets_401_and_changes_nothing(emulator: Emulator) -> None:
    before = emulator.vms()
    wrong = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    async with _client(emulator, secret=wrong) as bad:
        with pytest.raises(CrusoeRequestError) as e:
            await bad.delete_vm(before["gpu-01"]["id"])
    assert e.value.status == 401 and "signature does not match" in str(e.value)
    assert e.value.non_retryable
    assert emulator.vms() == before and emulator.backend.events == []
    assert len(emulator.requests(method="DELETE")) == 1  # a 401 is not retried


@pytest.mark.parametrize("offset", [timedelta(minutes=-10), timedelta(minutes=10)])
def test_a_stale_or_future_timestamp_gets_401_and_changes_nothing(
    emulator: Emulator, offset: timedelta
) -> None:
    before = emulator.vms()
    path = f"{VMS}/{before['gpu-01']['id']}"
    ts = format_timestamp(datetime.now(UTC) + offset)
    headers = sign(
        method="DELETE", path=path, query="", timestamp=ts, access_key_id=KEY_ID, secret_key=SECRET
    )
    resp = loopback.request("DELETE", emulator.server.url + path, headers=headers)
    assert resp.status_code == 401
    assert "off the clock" in resp.json()["message"]
    assert emulator.vms() == before and emulator.backend.events == []


def test_a_timestamp_inside_the_window_is_accepted(emulator: Emulator) -> None:
    ts = format_timestamp(datetime.now(UTC) - timedelta(minutes=2))
    query = "names=gpu-01,gpu-02&names=gpu-03"
    headers = sign(
        method="GET", path=VMS, query=query, timestamp=ts, access_key_id=KEY_ID, secret_key=SECRET
    )
    resp = loopback.get(f"{emulator.server.url}{VMS}?{query}", headers=headers)
    assert resp.status_code == 200
    assert sorted(vm["name"] for vm in resp.json()["items"]) == ["gpu-01", "gpu-02", "gpu-03"]


# --- retries ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [409, 429, 500, 502, 503, 504])
async def test_busy_throttled_and_failing_requests_are_retried(
    emulator: Emulator, client: CrusoeClient, status: int
) -> None:
    vm_id = emulator.vm_id("gpu-01")
    path = f"{VMS}/{vm_id}"
    emulator.inject(status=status, count=2, path_prefix=path)
    vm = await client.get_vm(vm_id)
    assert vm.name == "gpu-01"
    assert [r["status"] for r in emulator.requests(path)] == [status, status, 200]


async def test_retry_after_is_honoured(emulator: Emulator, client: CrusoeClient) -> None:
    emulator.inject(status=429, count=1, path_prefix=VMS, retry_after=1)
    started = time.monotonic()
    await client.list_vms()
    # The client's own backoff is 10 ms; only Retry-After makes it wait a second.
    assert time.monotonic() - started >= 0.9
    assert [r["status"] for r in emulator.requests(VMS)] == [429, 200]


async def test_a_create_retries_only_where_the_api_cannot_have_acted(
    emulator: Emulator, client: CrusoeClient
) -> None:
    spec = {"name": "gpu-09", "type": "h100-80gb-sxm-ib.8x", "location": "us-east1-a"}
    emulator.inject(status=500, count=1, path_prefix=VMS, method="POST")
    with pytest.raises(CrusoeUnavailable) as e:
        await client.create_vm(spec)
    assert e.value.status == 500 and not e.value.non_retryable
    assert len(emulator.requests(VMS, "POST")) == 1  # a 500 may have created it: not resent
    emulator.inject(status=503, count=1, path_prefix=VMS, method="POST")
    op = await client.create_vm(spec)
    await client.wait_operation(op, "vm")
    assert [r["status"] for r in emulator.requests(VMS, "POST")] == [500, 503, 200]
    assert emulator.vms()["gpu-09"]["state"] == "RUNNING"


async def test_a_400_is_not_retried_and_carries_the_api_message(
    emulator: Emulator, client: CrusoeClient
) -> None:
    with pytest.raises(CrusoeRequestError) as e:
        await client.create_vm({"name": "gpu-09", "location": "us-east1-a"})
    assert e.value.status == 400 and e.value.message == "type is required"
    assert "type is required" in str(e.value) and e.value.non_retryable
    assert len(emulator.requests(VMS, "POST")) == 1

    vm_id = emulator.vm_id("gpu-01")
    with pytest.raises(CrusoeRequestError, match="unknown action 'EXPLODE'"):
        await client.patch_vm_action(vm_id, "EXPLODE")  # type: ignore[arg-type]
    assert len(emulator.requests(f"{VMS}/{vm_id}", "PATCH")) == 1
    assert emulator.backend.events == []


async def test_retries_give_up_after_max_attempts(emulator: Emulator, client: CrusoeClient) -> None:
    emulator.inject(status=503, count=10, path_prefix=VMS)
    with pytest.raises(CrusoeUnavailable) as e:
        await client.list_vms()
    assert e.value.status == 503 and not e.value.non_retryable
    assert len(emulator.requests(VMS)) == 4


async def test_unknown_ids_are_404(client: CrusoeClient) -> None:
    with pytest.raises(CrusoeNotFound):
        await client.get_vm("no-such-vm")
    with pytest.raises(CrusoeNotFound):
        await client.get_node_pool("no-such-pool")


# --- operations -------------------------------------------------------------------------


async def test_a_reset_is_polled_to_succeeded(emulator: Emulator, client: CrusoeClient) -> None:
    vm_id = emulator.vm_id("gpu-01")
    op = await client.patch_vm_action(vm_id, "RESET")
    assert op.state == "IN_PROGRESS"
    seen: list[str] = []
    done = await client.wait_operation(op, "vm", on_poll=lambda o: seen.append(o.state))
    assert done.state == "SUCCEEDED" and done.operation_id == op.operation_id
    assert seen and set(seen) == {"IN_PROGRESS"}  # the heartbeat hook ran while it waited
    assert emulator.requests(f"{VMS}/operations/{op.operation_id}")
    assert emulator.backend.events == [("reset", "gpu-01", vm_id)]


async def test_a_busy_vm_answers_409(emulator: Emulator) -> None:
    vm_id = emulator.vm_id("gpu-01")
    emulator.admin("POST", "/timings", {"operation_s": 1.0})  # so the reset is surely running
    async with _client(emulator, max_attempts=1) as once:
        op = await once.patch_vm_action(vm_id, "RESET")
        with pytest.raises(CrusoeUnavailable) as e:
            await once.delete_vm(vm_id)
        assert e.value.status == 409 and op.operation_id in str(e.value)
        await once.wait_operation(op, "vm")
    assert "gpu-01" in emulator.vms()


async def test_a_failed_operation_raises_its_message(
    emulator: Emulator, client: CrusoeClient
) -> None:
    emulator.admin("POST", "/operation-failures", {"message": "host hardware fault"})
    op = await client.patch_vm_action(emulator.vm_id("gpu-01"), "RESET")
    with pytest.raises(CrusoeOperationFailed, match="host hardware fault") as e:
        await client.wait_operation(op, "vm")
    assert e.value.operation_id == op.operation_id


# --- the provider -----------------------------------------------------------------------


@pytest.mark.parametrize("rung", [Rung.RESET_GPU, Rung.REBOOT])
async def test_reset_gpu_and_reboot_reset_the_vm_in_place(
    emulator: Emulator, client: CrusoeClient, rung: Rung
) -> None:
    vm_id = emulator.vm_id("gpu-01")
    before = time.time()
    done = await _cloud(client).repair("gpu-01", rung, "inc-1:1")
    assert done.old_vm_id == done.new_vm_id == vm_id and done.rung == rung
    assert done.stopped_at is not None and before <= done.stopped_at <= time.time()
    assert emulator.backend.events == [("reset", "gpu-01", vm_id)]


async def test_a_stopped_vm_is_started_rather_than_reset(
    emulator: Emulator, client: CrusoeClient
) -> None:
    vm_id = emulator.vm_id("gpu-02")
    await client.wait_operation(await client.patch_vm_action(vm_id, "STOP"), "vm")
    assert (await client.get_vm(vm_id)).state == "SHUTOFF"
    done = await _cloud(client).repair("gpu-02", Rung.REBOOT, "k")
    assert done.new_vm_id == vm_id and (await client.get_vm(vm_id)).state == "RUNNING"
    assert [e[0] for e in emulator.backend.events] == ["stop", "start"]


async def test_replace_through_autoclusters_remediate(
    emulator: Emulator, client: CrusoeClient
) -> None:
    old = emulator.vm_id("gpu-01")
    cloud = _cloud(client, cluster_id=CLUSTER)
    assert await cloud.vm_id("gpu-01") == old
    done = await cloud.repair("gpu-01", Rung.REPLACE, "inc-1:1:replace")
    assert done.old_vm_id == old and done.new_vm_id != old
    assert emulator.vms()["gpu-01"] == {**emulator.vms()["gpu-01"], "id": done.new_vm_id}
    assert emulator.vms()["gpu-01"]["state"] == "RUNNING"
    remediate = f"/v1/projects/{PROJECT}/kubernetes/clusters/{CLUSTER}/autoclusters/vms/{old}"
    assert len(emulator.requests(remediate + "/remediate", "POST")) == 1
    assert emulator.backend.events == [
        ("delete", "gpu-01", old),
        ("create", "gpu-01", done.new_vm_id),
    ]
    assert await cloud.vm_id("gpu-01") == done.new_vm_id


async def test_replace_through_a_node_pool_delete(emulator: Emulator, client: CrusoeClient) -> None:
    old = emulator.vm_id("gpu-02")
    done = await _cloud(client, node_pool_ids=[POOL]).repair("gpu-02", Rung.REPLACE, "k")
    assert done.old_vm_id == old and done.new_vm_id == emulator.vm_id("gpu-02") != old
    assert len(emulator.requests(f"{VMS}/{old}", "DELETE")) == 1
    assert emulator.requests(VMS, "POST") == []  # the pool made the VM, not us
    pool = await client.get_node_pool(POOL)
    assert done.new_vm_id in pool.instance_ids and old not in pool.instance_ids


async def test_replace_recreates_a_vm_in_no_pool(emulator: Emulator, client: CrusoeClient) -> None:
    old = emulator.vms()["gpu-03"]
    cloud = _cloud(
        client, node_pool_ids=[POOL], create_defaults={"ssh_public_key": "ssh-ed25519 A"}
    )
    done = await cloud.repair("gpu-03", Rung.REPLACE, "k")
    new = emulator.vms()["gpu-03"]
    assert done.old_vm_id == old["id"] and done.new_vm_id == new["id"] != old["id"]
    assert (new["type"], new["location"], new["image"]) == (
        old["type"],
        old["location"],
        "ubuntu22.04-nvidia",
    )
    assert new["ssh_public_key"] == "ssh-ed25519 A"
    assert [e[0] for e in emulator.backend.events] == ["delete", "create"]


async def test_a_retry_that_finds_its_vm_deleted_and_its_progress_lost_recreates_it(
    emulator: Emulator, client: CrusoeClient
) -> None:
    # The first attempt deleted the VM; its worker died before the create and before its
    # progress reached the server. The spec recorded with the plan makes the successor.
    old = emulator.vms()["gpu-03"]
    cloud = _cloud(
        client, node_pool_ids=[POOL], create_defaults={"ssh_public_key": "ssh-ed25519 A"}
    )
    recorded, planned_at = await _plan(client, "gpu-03")
    spec = await cloud.machine_spec("gpu-03", recorded)
    assert spec["name"] == "gpu-03" and "ssh_public_key" not in spec  # not in the history
    await client.wait_operation(await client.delete_vm(recorded), "vm")

    done = await _cloud(
        client, node_pool_ids=[POOL], create_defaults={"ssh_public_key": "ssh-ed25519 A"}
    ).repair(
        "gpu-03", Rung.REPLACE, "inc-9:1:replace", vm_id=recorded, planned_at=planned_at,
        machine_spec=spec,
    )  # fmt: skip
    new = emulator.vms()["gpu-03"]
    assert done.old_vm_id == recorded == old["id"] and done.new_vm_id == new["id"] != old["id"]
    assert (new["type"], new["image"], new["ssh_public_key"]) == (
        old["type"], "ubuntu22.04-nvidia", "ssh-ed25519 A",
    )  # fmt: skip
    assert [e[0] for e in emulator.backend.events] == ["delete", "create"]  # one of each
    # A VM in a managed pool, or under AutoClusters, is replaced by Crusoe: nothing recorded.
    assert await cloud.machine_spec("gpu-01", emulator.vm_id("gpu-01")) == {}
    assert await _cloud(client, cluster_id=CLUSTER).machine_spec("gpu-03", new["id"]) == {}
    assert await cloud.machine_spec("gpu-03", recorded) == {}  # deleted: nothing to read


async def test_a_wrong_cluster_id_fails_at_once_with_the_api_message(
    emulator: Emulator, client: CrusoeClient
) -> None:
    with pytest.raises(CrusoeNotFound, match="cluster cmk-nope not found") as e:
        await _cloud(client, cluster_id="cmk-nope").repair("gpu-01", Rung.REPLACE, "k")
    assert e.value.non_retryable and emulator.backend.events == []


async def test_replace_returns_the_first_runbooks_result(client: CrusoeClient) -> None:
    done = await _cloud(client, cluster_id=CLUSTER).replace("gpu-01", "inc-7")
    assert done.node == "gpu-01" and done.new_vm_id != done.old_vm_id and done.stopped_at > 0


class Heartbeats:
    """What the repair activity keeps in its heartbeat details: the last progress reported."""

    def __init__(self) -> None:
        self.details: list[dict[str, Any]] = []

    def __call__(self, details: dict[str, Any]) -> None:
        self.details.append(details)

    @property
    def last(self) -> dict[str, Any] | None:
        return self.details[-1] if self.details else None


async def _plan(client: CrusoeClient, node: str) -> tuple[str, float]:
    """What `plan_repair` records in the workflow's history: the VM, and when."""
    planned_at = time.time()
    return await _cloud(client).vm_id(node), planned_at


def _operations(emulator: Emulator, vm_name: str) -> list[dict[str, Any]]:
    """The emulator's own record of what it did to the machine."""
    return list(emulator.admin("GET", f"/operations?vm_name={vm_name}")["operations"])


async def test_a_retry_with_heartbeat_details_resumes_the_same_operation(
    emulator: Emulator, client: CrusoeClient
) -> None:
    vm_id, planned_at = await _plan(client, "gpu-01")
    emulator.admin("POST", "/timings", {"operation_s": 1.0})  # the kill lands mid-operation
    beats = Heartbeats()
    first = asyncio.create_task(
        _cloud(client, cluster_id=CLUSTER).repair(
            "gpu-01", Rung.REPLACE, "inc-2:1:replace", vm_id=vm_id, planned_at=planned_at,
            on_progress=beats,
        )
    )  # fmt: skip

    async def operation_recorded() -> bool:
        return bool(beats.last and beats.last["operation_id"])

    await eventually(operation_recorded, timeout_s=10, what="the operation in the heartbeat")
    first.cancel()  # the worker dies mid-replace
    with pytest.raises(asyncio.CancelledError):
        await first
    # Temporal's retry, on another worker (a new provider, nothing on any disk).
    assert beats.last is not None
    recorded = beats.last["operation_id"]
    done = await _cloud(client, cluster_id=CLUSTER).repair(
        "gpu-01", Rung.REPLACE, "inc-2:1:replace", vm_id=vm_id, planned_at=planned_at,
        progress=beats.last, on_progress=beats,
    )  # fmt: skip
    assert done.old_vm_id == vm_id != done.new_vm_id == emulator.vm_id("gpu-01")
    assert len(emulator.requests(method="POST")) == 1
    assert [op["operation_id"] for op in _operations(emulator, "gpu-01")] == [recorded]
    assert [e[0] for e in emulator.backend.events] == ["delete", "create"]
    assert beats.last["done"] and beats.last["new_vm_id"] == done.new_vm_id


@pytest.mark.parametrize("route", ["reset", "remediate"])
async def test_a_retry_whose_heartbeat_was_lost_adopts_the_submitted_operation(
    emulator: Emulator, client: CrusoeClient, route: str
) -> None:
    # The worker sent the request and died before its heartbeat carried the operation id:
    # the retry has the plan (the history) and no details, yet one operation runs.
    vm_id, planned_at = await _plan(client, "gpu-01")
    emulator.admin("POST", "/timings", {"operation_s": 0.5})
    if route == "reset":
        rung, cloud = Rung.REBOOT, _cloud(client)
        submitted = await client.patch_vm_action(vm_id, "RESET")
    else:
        rung, cloud = Rung.REPLACE, _cloud(client, cluster_id=CLUSTER)
        submitted = await client.remediate_vm(CLUSTER, vm_id)
    beats = Heartbeats()
    done = await cloud.repair(
        "gpu-01", rung, "inc-4:1", vm_id=vm_id, planned_at=planned_at, on_progress=beats
    )
    ops = _operations(emulator, "gpu-01")
    assert [op["operation_id"] for op in ops] == [submitted.operation_id]  # exactly one
    assert ops[0]["state"] == "SUCCEEDED"
    assert any(d["operation_id"] == submitted.operation_id for d in beats.details)
    if route == "reset":
        assert done.old_vm_id == done.new_vm_id == vm_id
        assert emulator.backend.events == [("reset", "gpu-01", vm_id)]
        assert len(emulator.requests(method="PATCH")) == 1
    else:
        assert done.old_vm_id == vm_id != done.new_vm_id == emulator.vm_id("gpu-01")
        assert [e[0] for e in emulator.backend.events] == ["delete", "create"]
        assert len(emulator.requests(method="POST")) == 1
    assert done.stopped_at is not None and done.stopped_at >= planned_at - 1


async def test_a_retry_after_the_replacement_finished_returns_the_new_vm_and_deletes_nothing(
    emulator: Emulator, client: CrusoeClient
) -> None:
    vm_id, planned_at = await _plan(client, "gpu-02")
    first = await _cloud(client, node_pool_ids=[POOL]).repair(
        "gpu-02", Rung.REPLACE, "inc-3:1:replace", vm_id=vm_id, planned_at=planned_at
    )  # its result and its heartbeat were lost: the worker died as it finished
    events = list(emulator.backend.events)
    again = await _cloud(client, node_pool_ids=[POOL]).repair(
        "gpu-02", Rung.REPLACE, "inc-3:1:replace", vm_id=vm_id, planned_at=planned_at
    )
    assert (again.old_vm_id, again.new_vm_id) == (first.old_vm_id, first.new_vm_id)
    assert again.new_vm_id == emulator.vm_id("gpu-02") != vm_id
    assert len(emulator.requests(method="DELETE")) == 1
    assert (
        emulator.backend.events
        == events
        == [
            ("delete", "gpu-02", vm_id),
            ("create", "gpu-02", first.new_vm_id),
        ]
    )
    assert len(_operations(emulator, "gpu-02")) == 1


@pytest.mark.parametrize("rung", [Rung.REBOOT, Rung.REPLACE])
async def test_a_vm_other_than_the_recorded_one_is_never_touched(
    emulator: Emulator, client: CrusoeClient, rung: Rung
) -> None:
    # Planned on VM A; then someone else replaced the machine: B has the node's name now.
    recorded, planned_at = await _plan(client, "gpu-01")
    await client.wait_operation(await client.delete_vm(recorded), "vm")

    async def replaced() -> str | None:
        vm = emulator.vms().get("gpu-01")
        return str(vm["id"]) if vm and vm["state"] == "RUNNING" else None

    successor = await eventually(replaced, timeout_s=10, what="the pool's new VM")
    before = (len(emulator.requests(method="DELETE")), list(emulator.backend.events))
    done = await _cloud(client, node_pool_ids=[POOL], cluster_id=CLUSTER).repair(
        "gpu-01", rung, "inc-5:1", vm_id=recorded, planned_at=planned_at
    )
    assert done.old_vm_id == recorded and done.new_vm_id == successor
    assert (len(emulator.requests(method="DELETE")), emulator.backend.events) == before
    assert emulator.requests(method="PATCH") == [] and emulator.requests(method="POST") == []
    assert emulator.vm_id("gpu-01") == successor


async def test_a_repair_without_a_plan_acts_on_the_vm_named_so_now(
    emulator: Emulator, client: CrusoeClient
) -> None:
    # Incidents of older runbooks record no VM: the one that has the name when it runs.
    first = await _cloud(client, node_pool_ids=[POOL]).repair("gpu-01", Rung.REPLACE, "k1")
    second = await _cloud(client, node_pool_ids=[POOL]).repair("gpu-01", Rung.REPLACE, "k2")
    assert second.old_vm_id == first.new_vm_id != second.new_vm_id


async def test_monitor_is_not_a_repair(client: CrusoeClient) -> None:
    with pytest.raises(Exception, match="not a repair") as e:
        await _cloud(client).repair("gpu-01", Rung.MONITOR, "k")
    assert getattr(e.value, "non_retryable", False)


# --- secrecy ------------------------------------------------------------


async def test_the_secret_never_shows_in_repr_str_errors_or_logs(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    creds = _credentials(emulator.endpoint)
    for text in (repr(creds), str(creds), creds.model_dump_json(), str(creds.model_dump())):
        assert SECRET not in text
    assert SECRET not in repr(CrusoeAuth(KEY_ID, creds.secret_key))
    caplog.set_level(logging.DEBUG)
    emulator.inject(status=503, count=2, path_prefix=VMS)
    async with _client(emulator) as client:
        await _cloud(client, cluster_id=CLUSTER).repair("gpu-01", Rung.REPLACE, "k")
        assert SECRET not in repr(client.__dict__)
    async with _client(emulator, secret=SECRET[::-1]) as bad:
        with pytest.raises(CrusoeRequestError) as e:
            await bad.list_vms()
    assert SECRET not in str(e.value) and SECRET[::-1] not in str(e.value)
    assert "crusoe" in caplog.text  # the retries were logged, and nothing secret with them
    assert SECRET not in caplog.text and SECRET[::-1] not in caplog.text


# --- the emulator itself ----------------------------------------------------------------


async def test_the_emulator_keeps_its_world_in_the_state_file(tmp_path: Path) -> None:
    state = tmp_path / "crusoe.json"
    with EmulatorServer(create_app(_config(state_file=state))) as server:
        loopback.post(f"{server.url}/_emulator/vms", json=SEED).raise_for_status()
    with EmulatorServer(create_app(_config(state_file=state))) as server:
        emu = Emulator(server, InMemoryBackend())
        async with _client(emu) as client:
            assert sorted(vm.name for vm in await client.node_pool_vms(POOL)) == [
                "gpu-01",
                "gpu-02",
            ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.integration
async def test_the_emulator_runs_from_its_command_line() -> None:
    """Integration lane: it starts the emulator as a server process (make unit starts none)."""
    port = _free_port()
    argv = [sys.executable, "-m", "autoclusters.sandbox.crusoe.emulator", "--port", str(port)]
    argv += ["--access-key-id", KEY_ID, "--project", PROJECT, "--operation-s", "0.05"]
    argv += ["--backend", "autoclusters.sandbox.crusoe.world:InMemoryBackend"]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "CRUSOE_SECRET_KEY": SECRET},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        async def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/_emulator/health").status_code == 200
            except httpx.TransportError:
                return False

        await eventually(up, timeout_s=20, what="the emulator process")
        async with CrusoeClient(
            credentials=_credentials(f"http://127.0.0.1:{port}/v1"), poll_s=0.02
        ) as client:
            assert await client.list_vms() == []
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert SECRET.encode() not in err
