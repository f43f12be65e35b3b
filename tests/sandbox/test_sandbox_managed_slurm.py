"""Managed Slurm on the Crusoe emulator (issue 12's contract): clusters, their configuration
and users, slurm_cluster operations, VM topology, boot faults and quota.

The first tests run the emulator in memory (signed requests, `InMemoryBackend`); the last
one runs it with the sandbox backend, which starts real MariaDB, slurmdbd, slurmctld,
slurmd and a login sshd, and submits a job through the login endpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoclusters.core.process_start import start_ticks
from autoclusters.integrations.crusoe.signing import format_timestamp, sign
from autoclusters.sandbox.crusoe.emulator import EmulatorServer, create_app
from autoclusters.sandbox.crusoe.world import InMemoryBackend, VmBackend
from autoclusters.sandbox.machines.backend import SandboxMachines
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import (
    ProcessTable,
    kill_sessions,
    sessions_holding,
    wait_until,
)
from tests import loopback
from tests.conftest import free_port_base
from tests.emulators.test_crusoe import KEY_ID, PROJECT, SECRET, VMS, _config
from tests.helpers import eventually

CLUSTERS = f"/v1/projects/{PROJECT}/slurm/clusters"


class Api:
    """The emulator over signed HTTP, and its `/_emulator` controls."""

    def __init__(self, backend: VmBackend, **config: Any) -> None:
        self.backend = backend
        self.server = EmulatorServer(create_app(_config(**config), backend)).start()

    def call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        path, _, query = path.partition("?")
        ts = format_timestamp(datetime.now(UTC))
        headers = sign(
            method=method, path=path, query=query, timestamp=ts, access_key_id=KEY_ID,
            secret_key=SECRET,
        )  # fmt: skip
        url = self.server.url + path + (f"?{query}" if query else "")
        content = json.dumps(body).encode() if body is not None else None
        return loopback.request(
            method, url, headers={**headers, "Content-Type": "application/json"},
            content=content, timeout=30,
        )  # fmt: skip

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        r = self.call(method, path, body)
        assert r.status_code == 200, r.text
        return r.json()

    def admin(self, method: str, path: str, body: Any = None) -> Any:
        r = loopback.request(method, f"{self.server.url}/_emulator{path}", json=body, timeout=10)
        r.raise_for_status()
        return r.json()

    async def finished(self, op: dict[str, Any], kind_path: str, timeout_s: float = 30) -> Any:
        op_id = op["operation"]["operation_id"]

        async def done() -> dict[str, Any] | None:
            got: dict[str, Any] = self.ok("GET", f"{kind_path}/operations/{op_id}")
            return got if got["state"] != "IN_PROGRESS" else None

        return await eventually(done, timeout_s, f"operation {op_id}")

    def create_vm(self, name: str) -> httpx.Response:
        body = {"name": name, "type": "h100-80gb-sxm-ib.8x", "location": "us-east1-a"}
        return self.call("POST", VMS, body)


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api(InMemoryBackend())
    try:
        yield a
    finally:
        a.server.stop()


CREATE = {"name": "train", "location": "us-east1-a", "root_ssh_pub_keys": ["ssh-ed25519 AAAA x"]}


async def _created(api: Api, **extra: Any) -> str:
    op = api.ok("POST", CLUSTERS, {**CREATE, **extra})
    assert op["operation"]["metadata"]["action"] == "CREATE"
    done = await api.finished(op, CLUSTERS)
    assert done["state"] == "SUCCEEDED", done
    return str(done["result"]["slurm_cluster_id"])


async def test_cluster_create_get_list_delete(api: Api) -> None:
    cid = await _created(api, accounting_enabled=True)
    cluster = api.ok("GET", f"{CLUSTERS}/{cid}")
    assert cluster["state"] == "STATE_RUNNING"
    assert cluster["name"] == "train" and cluster["version"] == "22.05.8"
    assert cluster["accounting_enabled"] is True
    assert cluster["accounting_state"] == "STATE_RUNNING"
    assert cluster["login_node_endpoint"].startswith("127.0.0.1:")
    assert "root_ssh_pub_keys" not in cluster  # the emulator's own record
    assert [c["id"] for c in api.ok("GET", CLUSTERS)["items"]] == [cid]
    ops = api.ok("GET", f"{CLUSTERS}/operations?resource_id={cid}")["items"]
    assert [o["metadata"]["action"] for o in ops] == ["CREATE"]

    done = await api.finished(api.ok("DELETE", f"{CLUSTERS}/{cid}"), CLUSTERS)
    assert done["state"] == "SUCCEEDED"
    assert api.ok("GET", CLUSTERS)["items"] == []
    assert api.call("GET", f"{CLUSTERS}/{cid}").status_code == 404
    assert api.call("DELETE", f"{CLUSTERS}/{cid}").status_code == 404
    assert isinstance(api.backend, InMemoryBackend)
    assert [e[0] for e in api.backend.events] == ["cluster_create", "cluster_delete"]


async def test_duplicate_name_is_409_naming_the_existing_cluster(api: Api) -> None:
    cid = await _created(api)
    r = api.call("POST", CLUSTERS, CREATE)
    assert r.status_code == 409
    assert r.json()["code"] == "already_exists" and cid in r.json()["message"]
    assert len(api.ok("GET", CLUSTERS)["items"]) == 1


def test_create_without_location_names_the_field(api: Api) -> None:
    r = api.call("POST", CLUSTERS, {"name": "train"})
    assert r.status_code == 400 and r.json()["message"].startswith("location")


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"node_sets": [{"name": "gpu", "partition": "gpu", "nodes": ["gpu-01"]}]},
         "node_sets.0.gpus_per_node"),
        ({"node_sets": [{"name": "gpu", "partition": "gpu", "gpus_per_node": "eight"}]},
         "node_sets.0.gpus_per_node"),
        ({"node_sets": [{"name": "gpu", "partition": "gpu", "gpus_per_node": 8,
                         "nodes": ["GPU 1"]}]}, "node_sets.0"),
        ({"node_sets": [{"name": "a", "partition": "gpu", "gpus_per_node": 8, "nodes": ["n1"]},
                        {"name": "b", "partition": "gpu", "gpus_per_node": 8, "nodes": ["n1"]}]},
         "node_sets.1.nodes"),
        ({"node_sets": [{"name": "a", "partition": "gpu", "gpus_per_node": 8, "nodes": ["n1"]}],
          "drained": {"n2": "spare"}}, "drained.n2"),
        ({"node_sets": [], "topology_conf": "rm -rf /"}, "topology_conf"),
        ({"nodesets": []}, "nodesets"),
    ],
)  # fmt: skip
async def test_bad_configuration_is_400_naming_the_field(
    api: Api, config: dict[str, Any], field: str
) -> None:
    cid = await _created(api)
    r = api.call("PUT", f"{CLUSTERS}/{cid}/configuration", config)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "bad_request"
    assert r.json()["message"].startswith(field), r.json()
    assert api.ok("GET", f"{CLUSTERS}/{cid}")["nodesets"] == []


async def test_configuration_and_users(api: Api) -> None:
    cid = await _created(api, accounting_enabled=True)
    config = {
        "node_sets": [
            {"name": "gpu", "partition": "gpu", "gpus_per_node": 8, "nodes": ["gpu-01", "gpu-02"]}
        ],
        "topology_conf": "SwitchName=leaf-01 Nodes=gpu-[01-02]\n",
        "drained": {"gpu-02": "new node"},
    }
    op = api.ok("PUT", f"{CLUSTERS}/{cid}/configuration", config)
    assert op["operation"]["metadata"] == {"slurm_cluster_id": cid, "action": "CONFIGURE"}
    assert (await api.finished(op, CLUSTERS))["state"] == "SUCCEEDED"
    cluster = api.ok("GET", f"{CLUSTERS}/{cid}")
    assert cluster["nodesets"] == [{"name": "gpu", "partition": "gpu", "count": 2}]
    assert cluster["controller_state"] == "STATE_RUNNING"

    user = {"name": "alice", "ssh_public_keys": ["ssh-ed25519 AAAA a"], "slurm_account": "ml"}
    assert api.ok("POST", f"{CLUSTERS}/{cid}/users", user) == {"name": "alice"}
    assert api.ok("POST", f"{CLUSTERS}/{cid}/users", user) == {"name": "alice"}  # idempotent
    bad = api.call("POST", f"{CLUSTERS}/{cid}/users", {"name": "Alice Smith"})
    assert bad.status_code == 400 and bad.json()["message"].startswith("name")
    assert isinstance(api.backend, InMemoryBackend)
    assert [e[0] for e in api.backend.events].count("cluster_user") == 2


async def test_quota_refuses_with_nothing_created(api: Api) -> None:
    assert api.create_vm("gpu-01").status_code == 200
    api.admin("POST", "/quota", {"max_vms": 1})
    r = api.create_vm("gpu-02")
    assert r.status_code == 403
    assert r.json() == {
        "code": "quota_exceeded",
        "message": f"quota exceeded: 1 VMs of 1 used in project {PROJECT}",
    }
    assert [vm["name"] for vm in api.ok("GET", VMS)["items"]] == ["gpu-01"]
    api.admin("POST", "/quota", {"max_vms": None})
    assert api.create_vm("gpu-02").status_code == 200


async def test_boot_fault_fail(api: Api) -> None:
    api.admin("POST", "/boot-faults", {"name": "gpu-02", "mode": "fail", "count": 1})
    op = api.create_vm("gpu-02").json()
    done = await api.finished(op, VMS)
    assert done["state"] == "FAILED"
    assert done["result"]["message"] == "VM gpu-02 failed to boot"
    (vm,) = api.ok("GET", VMS)["items"]
    assert vm["state"] == "FAILED"
    # The fault was for one boot: the next one of that name boots.
    api.ok("DELETE", f"{VMS}/{vm['id']}")

    async def gone() -> bool:
        return not api.ok("GET", VMS)["items"]

    await eventually(gone, 10, "the failed VM deleted")
    assert (await api.finished(api.create_vm("gpu-02").json(), VMS))["state"] == "SUCCEEDED"


async def test_boot_fault_hang_until_deleted(api: Api) -> None:
    api.admin("POST", "/boot-faults", {"name": "*", "mode": "hang"})
    op = api.create_vm("gpu-03").json()
    op_id = op["operation"]["operation_id"]

    async def provisioning() -> bool:
        (vm,) = api.ok("GET", VMS)["items"]
        return bool(vm["state"] == "PROVISIONING")

    await eventually(provisioning, 10, "the VM hanging in PROVISIONING")
    assert api.ok("GET", f"{VMS}/operations/{op_id}")["state"] == "IN_PROGRESS"
    vm_id = api.ok("GET", VMS)["items"][0]["id"]
    delete = api.call("DELETE", f"{VMS}/{vm_id}")
    assert delete.status_code == 200, delete.text
    assert (await api.finished(op, VMS))["state"] == "FAILED"
    assert (await api.finished(delete.json(), VMS))["state"] == "SUCCEEDED"


async def test_vms_carry_their_topology(api: Api) -> None:
    for name in ("gpu-01", "gpu-04", "gpu-05", "gpu-09"):
        api.create_vm(name)
    topo = {vm["name"]: vm["topology"] for vm in api.ok("GET", VMS)["items"]}
    assert topo["gpu-01"] == topo["gpu-04"] == {"pod": "pod-01", "leaf": "leaf-01"}
    assert topo["gpu-05"] == {"pod": "pod-01", "leaf": "leaf-02"}
    assert topo["gpu-09"] == {"pod": "pod-02", "leaf": "leaf-03"}
    vm_id = api.ok("GET", VMS)["items"][0]["id"]
    assert api.ok("GET", f"{VMS}/{vm_id}")["topology"]["pod"].startswith("pod-")


async def test_clusters_survive_an_emulator_restart(tmp_path: Path) -> None:
    state = tmp_path / "world.json"
    first = Api(InMemoryBackend(), state_file=state)
    try:
        cid = await _created(first)
    finally:
        first.server.stop()
    second = Api(InMemoryBackend(), state_file=state)
    try:
        assert second.ok("GET", f"{CLUSTERS}/{cid}")["state"] == "STATE_RUNNING"
        ops = second.ok("GET", f"{CLUSTERS}/operations")["items"]
        assert [o["state"] for o in ops] == ["SUCCEEDED"]
    finally:
        second.server.stop()


# --- the sandbox backend: real daemons ----------------------------------------------------


def _ssh(cfg: SandboxConfig, key: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", "-p", str(cfg.login_port), "-i", str(key), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def _alive(pid: int) -> bool:
    return start_ticks(pid) is not None


@pytest.fixture
def sandbox_cfg(tmp_path: Path) -> Iterator[SandboxConfig]:
    """A bare sandbox state dir with munged running (what `sandbox up` starts first);
    every process recorded in it is stopped by PID at the end."""
    cfg = SandboxConfig(
        state_dir=tmp_path / "s", cluster="msl", nodes=2, port_base=free_port_base(100),
        boot_delay_s=0,
    )  # fmt: skip
    (cfg.state_dir / "munge").mkdir(parents=True)
    os.chmod(cfg.state_dir / "munge", 0o755)
    key = cfg.state_dir / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    os.chmod(key, 0o400)
    cfg.log_dir.mkdir()
    cfg.save()
    table = ProcessTable(cfg.state_dir)
    try:
        table.spawn("munged", daemons.munged_argv(cfg))
        assert wait_until(lambda: daemons.munge_ready(cfg), 10)
        yield cfg
    finally:
        for rec in reversed(table.records()):
            table.stop(rec.name)
        kill_sessions(sessions_holding(cfg.spool_dir))
        # The spool lives in the system's temp dir (socket paths must be short), not tmp_path.
        shutil.rmtree(cfg.spool_dir, ignore_errors=True)


@pytest.mark.integration
async def test_managed_slurm_cluster_on_real_daemons(
    sandbox_cfg: SandboxConfig, tmp_path: Path
) -> None:
    cfg = sandbox_cfg
    key = tmp_path / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30
    )
    api = Api(SandboxMachines(cfg.state_dir))
    try:
        cid = await _created(
            api, accounting_enabled=True, root_ssh_pub_keys=[key.with_suffix(".pub").read_text()]
        )
        cluster = api.ok("GET", f"{CLUSTERS}/{cid}")
        assert cluster["login_node_endpoint"] == f"127.0.0.1:{cfg.login_port}"
        assert cluster["accounting_state"] == "STATE_RUNNING"
        table = ProcessTable(cfg.state_dir)
        assert all(table.alive(n) for n in ("mariadb", "slurmdbd", "sshd-login"))

        for name in ("gpu-01", "gpu-02"):
            assert (await api.finished(api.create_vm(name).json(), VMS))["state"] == "SUCCEEDED"
        assert not table.alive("slurmd-gpu-01")  # not in slurm.conf yet: the VM only boots

        config = {
            "node_sets": [{"name": "gpu", "partition": "gpu", "gpus_per_node": 8,
                           "nodes": ["gpu-01", "gpu-02"]}],
            "topology_conf": "SwitchName=leaf-01 Nodes=gpu-01\nSwitchName=leaf-02 Nodes=gpu-02\n"
            "SwitchName=spine Switches=leaf-[01-02]\n",
        }  # fmt: skip
        op = api.ok("PUT", f"{CLUSTERS}/{cid}/configuration", config)
        assert (await api.finished(op, CLUSTERS, 90))["state"] == "SUCCEEDED"
        assert api.ok("GET", f"{CLUSTERS}/{cid}")["controller_state"] == "STATE_RUNNING"
        user = {"name": "alice", "ssh_public_keys": ["ssh-ed25519 AAAA a"], "slurm_account": "ml"}
        assert api.ok("POST", f"{CLUSTERS}/{cid}/users", user) == {"name": "alice"}

        async def idle() -> bool:
            r = _ssh(cfg, key, "sinfo -h -N -o '%N %t'")
            return r.returncode == 0 and r.stdout.count("idle") == 2

        await eventually(idle, 60, "both nodes idle in sinfo over the login endpoint")
        job = _ssh(cfg, key, "sbatch --parsable -N2 --wrap 'srun -N2 hostname'")
        assert job.returncode == 0, job.stderr
        job_id = job.stdout.strip()

        async def completed() -> bool:
            r = _ssh(cfg, key, f"sacct -n -X -P -j {job_id} --format=State")
            return r.stdout.strip() == "COMPLETED"

        await eventually(completed, 60, f"job {job_id} COMPLETED in sacct")
        topo = _ssh(cfg, key, "scontrol show topology")
        assert "SwitchName=leaf-01" in topo.stdout and "SwitchName=spine" in topo.stdout
        users = _ssh(cfg, key, "sacctmgr -n -P show user alice format=User,DefaultAccount")
        assert users.stdout.strip() == "alice|ml"

        # Scale up: a new node joins drained; the others keep their slurmd ports.
        conf_before = cfg.slurm_conf.read_text()
        assert (await api.finished(api.create_vm("gpu-03").json(), VMS))["state"] == "SUCCEEDED"
        config["node_sets"][0]["nodes"].append("gpu-03")  # type: ignore[index]
        config["drained"] = {"gpu-03": "new node"}
        op = api.ok("PUT", f"{CLUSTERS}/{cid}/configuration", config)
        assert (await api.finished(op, CLUSTERS, 90))["state"] == "SUCCEEDED"
        gpu01 = next(x for x in conf_before.splitlines() if x.startswith("NodeName=gpu-01 "))
        assert gpu01 in cfg.slurm_conf.read_text()

        async def joined_drained() -> bool:
            r = _ssh(cfg, key, "sinfo -h -N -o '%N %t'")
            states = dict(line.split() for line in r.stdout.splitlines())
            return states == {"gpu-01": "idle", "gpu-02": "idle", "gpu-03": "drain"}

        await eventually(joined_drained, 60, "gpu-03 registered drained beside two idle nodes")

        pids = {r.name: r.pid for r in table.records()}
        done = await api.finished(api.ok("DELETE", f"{CLUSTERS}/{cid}"), CLUSTERS, 60)
        assert done["state"] == "SUCCEEDED"
        for name in ("mariadb", "slurmdbd", "slurmctld", "sshd-login"):
            assert not _alive(pids[name]), name
    finally:
        api.server.stop()
