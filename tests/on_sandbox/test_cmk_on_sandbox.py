"""Issue 21 items 2-3 on a real sandbox: provider crusoe-cmk provisions Slurm (Slinky) on the
sandbox's CMK cluster, and the cluster is scaled, deleted and created again from
examples/clusters/cmk.yaml through the CLI.

The sandbox (`platform="cmk"`) creates the CMK cluster through the Crusoe emulator; its
`ClusterProvisioning` makes the node pool, whose VMs' Nodes carry the pool's labels, applies
the Slinky objects and their Secrets, and the emulated operator's pods run the real daemons
(slurmctld, slurmdbd on MariaDB, sshd, one slurmd per Node), which Debian's kubectl lists.
The node agents are the pods of the shipped agent DaemonSet (deploy/kubernetes/agent.yaml),
one per GPU Node, each a process started with the command line the manifest renders to.

The API places the Slurm nodes in the racks their CMK Nodes' labels name.

One sandbox for the module, the tests in order: they tell one story.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from autoclusters.clients import fabric_topology
from autoclusters.core.cluster_spec import load_cluster_spec
from autoclusters.core.policy import default_policy
from autoclusters.core.process_start import command_line
from autoclusters.core.settings import load_file
from autoclusters.sandbox import restart
from autoclusters.sandbox.kubernetes import daemonsets as k8s_daemonsets
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.runtime.processes import (
    ProcessTable,
    referencing,
    wait_until,
)
from autoclusters.sandbox.slinky import agent_daemonset
from autoclusters.sandbox.slinky import operator_pods as slinky_pods
from tests.conftest import free_port_base
from tests.helpers import eventually, kubectl, own_sandbox

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "cmk.yaml"
CLI = [sys.executable, "-m", "autoclusters.clients.cli"]
SLURM_DAEMONS = ("slurmctld", "slurmdbd", "mariadb", "sshd-login")


@pytest_asyncio.fixture(scope="module")
async def cfg(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SandboxConfig]:
    # Named as the example spec, so `cluster create -f examples/clusters/cmk.yaml` makes this
    # sandbox's cluster again at the end.
    spec, _ = load_cluster_spec(EXAMPLE)
    c = SandboxConfig(
        state_dir=tmp_path_factory.mktemp("cmk"), cluster=spec.name, platform="cmk",
        nodes=spec.node_sets[0].count, port_base=free_port_base(), boot_delay_s=1,
        breaker_threshold=100, accounting=True,
    )  # fmt: skip
    # Nor anything the table never knew of (a slurmd whose record was lost once).
    async with own_sandbox(c):
        yield c


def _cli(cfg: SandboxConfig, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AUTOCLUSTERS_CONFIG": str(cfg.settings_file)}
    return subprocess.run(
        [*CLI, "cluster", *args], env=env, capture_output=True, text=True, timeout=400
    )


def _slurm(cfg: SandboxConfig, *argv: str) -> str:
    env = {**os.environ, "SLURM_CONF": str(cfg.slurm_conf)}
    r = subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _world(cfg: SandboxConfig) -> Any:
    return httpx.get(f"http://127.0.0.1:{cfg.crusoe_port}/_emulator/state", timeout=10).json()


def _running_slurmd_pods(cfg: SandboxConfig) -> list[str]:
    """The slurmd pods kubectl shows Running and Ready, by their Slurm node."""
    out = kubectl(
        cfg, "get", "pods", "-A", "-l", "app.kubernetes.io/name=slurmd", "-o",
        "jsonpath={range .items[*]}{.metadata.labels.nodeset\\.slinky\\.slurm\\.net/pod-hostname}"
        " {.status.phase} {.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
    )  # fmt: skip
    rows = [line.split() for line in out.splitlines() if line.strip()]
    return sorted(r[0] for r in rows if r[1:] == ["Running", "True"])


def _agent_pods(cfg: SandboxConfig) -> dict[str, Any]:
    """The agent DaemonSet's live pods kubectl shows (not being deleted, not ended: what
    its controller keeps one of per Node), by their Node."""
    out = kubectl(
        cfg, "get", "pods", "-n", "autoclusters", "-l",
        f"{agent_daemonset.APP_LABEL}={agent_daemonset.APP}", "-o", "json",
    )  # fmt: skip
    items = json.loads(out)["items"]
    return {p["spec"]["nodeName"]: p for p in k8s_daemonsets.active(items)}


def _node_running(cfg: SandboxConfig, slurm: str) -> str:
    """The Node whose slurmd registers as the Slurm node `slurm`, as kubectl shows it: the
    pool's VMs take the slots as each slot's creation gets the ledger's lock, so cmk-gpu-1
    may run gpu-02."""
    nodes = json.loads(kubectl(cfg, "get", "nodes", "-o", "json"))["items"]
    (kube,) = [n["metadata"]["name"] for n in nodes if slinky_pods.hostname_of(n) == slurm]
    return str(kube)


def _running_agents(cfg: SandboxConfig) -> dict[str, int]:
    """Node -> the PID of its agent pod's container, for the pods Running and Ready whose
    process runs."""
    table = ProcessTable(cfg.state_dir)
    alive = {r.pid for r in table.records() if table.alive(r.name)}
    out = {}
    for node, pod in _agent_pods(cfg).items():
        conds = {c["type"]: c["status"] for c in pod["status"].get("conditions") or []}
        pid = agent_daemonset.pid_of(pod)
        if (
            pod["status"].get("phase") == "Running"
            and conds.get("Ready") == "True"
            and pid in alive
        ):
            out[node] = pid
    return out


def _unrecorded(cfg: SandboxConfig) -> list[tuple[int, list[str]]]:
    """Processes whose command line or environment names the sandbox's state dir, outside
    the session of every process its table records alive: daemons that escaped the table
    (`sandbox down` would leave them running). A client a daemon runs (sinfo, scontrol)
    is in that daemon's session; a job's steps are in slurmstepd's own, so this is asked
    where no job runs."""
    table = ProcessTable(cfg.state_dir)
    recorded = {r.pid for r in table.records() if table.alive(r.name)}
    out = []
    for pid, argv in referencing(cfg.state_dir):
        try:
            if os.getsid(pid) not in recorded:
                out.append((pid, argv))
        except ProcessLookupError:
            continue
    return out


async def _nothing_unrecorded(cfg: SandboxConfig) -> None:
    # A moment: a daemon starting is recorded just before it runs (its spawner may be
    # between the two when we look).
    ok = await asyncio.to_thread(wait_until, lambda: _unrecorded(cfg) == [], 30, 0.5)
    assert ok, f"running outside the sandbox's process table: {_unrecorded(cfg)}"


def _slurm_nodes(cfg: SandboxConfig) -> list[str]:
    out = _slurm(cfg, "sinfo", "-h", "-N", "-o", "%N %T")
    return sorted(line.split()[0] for line in out.splitlines() if "idle" in line)


async def test_the_provisioned_cluster_runs_on_the_operators_pods(cfg: SandboxConfig) -> None:
    nodes = kubectl(cfg, "get", "nodes")
    assert "cmk-gpu-1" in nodes and "cmk-gpu-2" in nodes and "Ready" in nodes
    crs = kubectl(cfg, "get", "nodesets,controllers", "-A")
    assert "nodeset.slinky.slurm.net/cmk-gpu" in crs and "controller.slinky.slurm.net/cmk" in crs
    pods = kubectl(cfg, "get", "pods", "-A")
    for pod in ("cmk-controller-0", "cmk-accounting-0", "cmk-login-0"):
        assert pod in pods
    assert _running_slurmd_pods(cfg) == ["gpu-01", "gpu-02"]
    secrets = kubectl(cfg, "get", "secrets", "-n", "slurm", "-o", "name")
    for name in ("auth-slurm", "auth-jwt", "sssd-conf", "mariadb-password"):
        assert f"secret/cmk-{name}" in secrets
    # Every slurmd registered, and a job runs on both nodes.
    assert _slurm_nodes(cfg) == ["gpu-01", "gpu-02"]
    out = _slurm(cfg, "srun", "-N", "2", "-p", "gpu", "hostname")
    assert len(out.split()) == 2
    # The pool is the node set's, in the CMK cluster the sandbox made.
    (pool,) = _world(cfg)["pools"].values()
    assert pool["name"] == "cmk-gpu" and pool["cluster_id"] == cfg.cmk_cluster_id


async def test_the_api_places_each_slurm_node_in_its_nodes_rack(cfg: SandboxConfig) -> None:
    """The racks an incident opens with come from the CMK Nodes' labels (docs/systemic.md
    "Topology"): cmk-gpu-N is its Slurm node by its hostname-override, in the rack and
    NVLink clique the machine's Node carries; no rack is named in the policy."""
    fabric_topology._labels.clear()
    settings = load_file(cfg.settings_file)
    topo = (await fabric_topology.with_fabric_topology(settings, default_policy())).topology
    racks = {n: t.rack for n, t in topo.items() if t.rack}
    assert racks == {"gpu-01": "rack-01", "gpu-02": "rack-01"}, topo
    fabric_topology._labels.clear()


async def test_the_agents_are_the_shipped_daemonsets_pods(cfg: SandboxConfig) -> None:
    """One agent pod per GPU Node (none on the system node), Running with its PID, and that
    process runs the command line the shipped manifest renders to on that Node."""
    await eventually(
        lambda: _async(sorted(_running_agents(cfg)) == ["cmk-gpu-1", "cmk-gpu-2"]),
        60,
        "an agent pod Running on each GPU Node",
    )
    ds = json.loads(kubectl(cfg, "get", "ds", "-n", "autoclusters", "autoclusters-agent",
                             "-o", "json"))  # fmt: skip
    shipped = agent_daemonset.load()
    assert (
        ds["spec"]["template"]["spec"]["containers"][0]["args"]
        == (shipped["spec"]["template"]["spec"]["containers"][0]["args"])
    )
    assert ds["status"]["desiredNumberScheduled"] == 2 and ds["status"]["numberReady"] == 2
    listed = json.loads(kubectl(cfg, "get", "nodes", "-o", "json"))["items"]
    nodes = {n["metadata"]["name"]: n for n in listed}
    table = ProcessTable(cfg.state_dir)
    for node, pid in _running_agents(cfg).items():
        pod = _agent_pods(cfg)[node]
        slurm = slinky_pods.hostname_of(nodes[node])
        want = agent_daemonset.render(
            cfg, pod["spec"], agent_daemonset.Node(node, slurm), lambda name, key: "unused"
        )
        assert command_line(pid) == want.argv
        rec = table.get(f"agent-{slurm}")
        assert rec is not None and rec.pid == pid  # what restarts and chaos find by name


async def test_an_agent_restarts_as_its_pod(cfg: SandboxConfig) -> None:
    """SIGTERM deletes the pod (the DaemonSet makes a new one), SIGKILL crashes the container
    (the same pod runs it again, restartCount + 1)."""
    kube = _node_running(cfg, "gpu-01")
    before = _agent_pods(cfg)[kube]
    done = await asyncio.to_thread(restart.restart, cfg, "agent-gpu-01")
    after = _agent_pods(cfg)[kube]
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    assert agent_daemonset.pid_of(after) == done.new_pid != done.old_pid
    assert not Path(f"/proc/{done.old_pid}").exists()
    done = await asyncio.to_thread(restart.restart, cfg, "agent-gpu-01", kill=True)
    crashed = _agent_pods(cfg)[kube]
    assert crashed["metadata"]["uid"] == after["metadata"]["uid"]
    assert agent_daemonset.pid_of(crashed) == done.new_pid
    assert agent_daemonset.restarts_of(crashed) == agent_daemonset.restarts_of(after) + 1


async def test_kubectl_cordon_of_a_node_drains_its_slurm_node(cfg: SandboxConfig) -> None:
    """On CMK the Node (cmk-gpu-N) is not named as its Slurm node (gpu-01): a real kubectl's
    cordon of the Node drains the Slurm node of its hostname-override within seconds (the
    operator's reason), and uncordon undrains it, the drain being the operator's own."""
    kube = _node_running(cfg, "gpu-01")
    assert kube != "gpu-01"

    def state() -> tuple[str, str]:
        out = _slurm(cfg, "sinfo", "-h", "-n", "gpu-01", "-o", "%T|%E")
        st, _, reason = out.strip().partition("|")
        return st, reason

    def drained() -> bool:
        st, reason = state()
        return "drain" in st and reason.startswith("slurm-operator: ")

    assert "drain" not in state()[0]
    kubectl(cfg, "cordon", kube)
    await eventually(lambda: _async(drained()), 30, "gpu-01 drained by the cordon of its Node")
    kubectl(cfg, "uncordon", kube)
    await eventually(lambda: _async(not drained()), 30, "gpu-01 undrained")
    assert "drain" not in state()[0]


@pytest.mark.timeout(600)
async def test_scale_out_and_in(cfg: SandboxConfig) -> None:
    r = _cli(cfg, "scale", cfg.cluster, "gpu", "3", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    assert _slurm_nodes(cfg) == ["gpu-01", "gpu-02", "gpu-03"]
    await eventually(
        lambda: _async(_running_slurmd_pods(cfg) == ["gpu-01", "gpu-02", "gpu-03"]),
        30,
        "three running slurmd pods",
    )
    # The new Node got its agent pod.
    await eventually(
        lambda: _async(sorted(_running_agents(cfg)) == ["cmk-gpu-1", "cmk-gpu-2", "cmk-gpu-3"]),
        30,
        "three running agent pods",
    )
    gone = _running_agents(cfg)["cmk-gpu-3"]
    r = _cli(cfg, "scale", cfg.cluster, "gpu", "2", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    await eventually(
        lambda: _async(_running_slurmd_pods(cfg) == ["gpu-01", "gpu-02"]), 30, "two pods"
    )
    assert len(_world(cfg)["vms"]) == 2
    # The removed Node's agent pod and its process went; no slurmd of it is left either.
    await eventually(
        lambda: _async(sorted(_agent_pods(cfg)) == ["cmk-gpu-1", "cmk-gpu-2"]), 30, "two agents"
    )
    await eventually(lambda: _async(not Path(f"/proc/{gone}").exists()), 30, "its agent gone")
    table = ProcessTable(cfg.state_dir)

    async def none_of_gpu_03() -> bool:
        # The kubelet stops them by PID as it sees their pods go: a moment after the pods.
        return not table.alive("agent-gpu-03") and not table.alive("slurmd-gpu-03")

    await eventually(none_of_gpu_03, 30, "gpu-03's agent and slurmd processes stopped")

    # Nor does any process of gpu-03 run unrecorded: none names the sandbox's state dir and
    # gpu-03 (slurmd's `-N gpu-03`, the agent's node and spool), none escaped the table.
    def of_gpu_03() -> list[list[str]]:
        return [a for _, a in referencing(cfg.state_dir) if any("gpu-03" in x for x in a)]

    assert await asyncio.to_thread(wait_until, lambda: of_gpu_03() == [], 30, 0.5), of_gpu_03()
    await _nothing_unrecorded(cfg)


@pytest.mark.timeout(900)
async def test_delete_leaves_nothing_then_create_from_the_example(cfg: SandboxConfig) -> None:
    r = _cli(cfg, "delete", cfg.cluster, "--yes", "--wait")
    assert r.returncode == 0, r.stdout + r.stderr
    world = _world(cfg)
    assert world["pools"] == {} and world["vms"] == {}
    table = ProcessTable(cfg.state_dir)

    def daemons() -> list[str]:
        return [
            r.name
            for r in table.records()
            if table.alive(r.name)
            and (r.name in SLURM_DAEMONS or r.name.startswith(("slurmd-", "agent-")))
        ]

    await eventually(lambda: _async(daemons() == []), 60, "no Slurm daemon left")
    await _nothing_unrecorded(cfg)
    await eventually(
        lambda: _async(kubectl(cfg, "get", "pods", "-A", "-o", "name") == ""), 30, "no pod"
    )
    assert "cmk-gpu" not in kubectl(cfg, "get", "nodes", "-o", "name")

    # A bad spec is refused with its field named, before anything is made.
    bad = cfg.state_dir / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("count: 2", "count: -1"))
    r = _cli(cfg, "create", "-f", str(bad))
    assert r.returncode == 2 and "count" in r.stdout + r.stderr, r.stdout + r.stderr

    r = _cli(cfg, "create", "-f", str(EXAMPLE))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "cluster cmk is ready" in r.stdout
    assert _slurm_nodes(cfg) == ["gpu-01", "gpu-02"]
    await eventually(
        lambda: _async(_running_slurmd_pods(cfg) == ["gpu-01", "gpu-02"]), 30, "two pods"
    )


async def _async(value: bool) -> bool:
    return value
