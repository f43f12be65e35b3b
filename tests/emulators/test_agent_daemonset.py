"""The node agent as the DaemonSet it ships as (issue 21 item 5), without a sandbox:

- the shipped deploy/kubernetes/agent.yaml renders, through the sandbox's named
  substitutions only, to the process a CMK sandbox starts, with the same agent options as
  the Managed Slurm sandbox's agent; a change to the manifest's command, args, env or mounts
  that no rule accounts for is refused (ManifestDrift), naming what changed;
- the Kubernetes emulator's DaemonSet controller keeps one pod per eligible Node (node
  selector, taints), replaces a deleted pod, drops a gone Node's, and reports its status,
  through the official client; `kubectl get ds` lists it.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from autoclusters.core.process_start import command_line
from autoclusters.integrations.k8s import api_client
from autoclusters.sandbox.kubernetes.emulator import Running, running
from autoclusters.sandbox.runtime import daemons
from autoclusters.sandbox.runtime.config import SandboxConfig
from autoclusters.sandbox.slinky import agent_daemonset as shipped

TOKEN = "test-token"
NODE = shipped.Node(name="cmk-gpu-1", slurm="gpu-01")
SECRETS = {("autoclusters-api-tokens", "AUTOCLUSTERS_AGENT_TOKEN"): "agent-token"}


@pytest.fixture
def cfg(tmp_path: Path) -> SandboxConfig:
    c = SandboxConfig(state_dir=tmp_path / "sandbox", platform="cmk", port_base=42000)
    (c.state_dir / "api").mkdir(parents=True)
    (c.state_dir / "api" / "token").write_text("agent-token")
    return c


def _secret(name: str, key: str) -> str | None:
    return SECRETS.get((name, key))


def _pod_spec(ds: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = ds["spec"]["template"]["spec"]
    return spec


def _options(argv: list[str]) -> dict[str, str]:
    """`--flag value` and `--flag=value` alike; a bare flag maps to ""."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--"):
            flag, sep, value = a.partition("=")
            if not sep and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            out[flag] = value
        i += 1
    return out


def test_the_shipped_manifest_renders_to_the_sandboxs_agent(cfg: SandboxConfig) -> None:
    ds = shipped.load()
    shipped.check(ds)
    c = shipped.render(cfg, _pod_spec(ds), NODE, _secret)
    assert c.argv[: len(shipped.ENTRYPOINT) + 2] == [*shipped.ENTRYPOINT, "agent", "run"]
    opts = _options(c.argv)
    # Kept as shipped: the Kubernetes Node from NODE_NAME ($(VAR) expanded), whose Slurm
    # node the agent reads off the Node (through the sandbox's kubeconfig); the spool through
    # its mount.
    assert opts["--node"] == "cmk-gpu-1"
    assert "--slurm-name-from-node" in c.argv and opts["--kubeconfig"] == str(cfg.kubeconfig)
    assert opts["--spool-dir"] == str(cfg.agent_spool("gpu-01"))
    assert c.mounts["/var/lib/autoclusters/agent"] == cfg.agent_spool("gpu-01")
    # Substituted, each by its rule.
    assert opts["--backend"] == "fake" and opts["--fake-file"] == str(cfg.agent_file("gpu-01"))
    assert opts["--api"] == cfg.api_url
    assert opts["--metrics-port"] == str(cfg.agent_metrics_port("gpu-01"))
    assert "--sysfs-root" not in opts and "--k8s-condition" not in opts
    # The env: the token from its Secret, the shipped constants, loopback metrics, no token.
    assert c.env["AUTOCLUSTERS_AGENT_TOKEN"] == "agent-token"
    assert c.env["NODE_NAME"] == "cmk-gpu-1"
    assert c.env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert c.env["AUTOCLUSTERS_AGENT_METRICS_HOST"] == "127.0.0.1"
    assert "AUTOCLUSTERS_AGENT_METRICS_TOKEN" not in c.env
    # The same agent as the Managed Slurm sandbox runs as a plain process.
    managed = _options(daemons.agent_argv(cfg, "gpu-01"))
    named_by_its_node = {"--node": "cmk-gpu-1", "--slurm-name-from-node": "",
                         "--kubeconfig": str(cfg.kubeconfig)}  # fmt: skip
    assert opts == managed | named_by_its_node
    assert {k: v for k, v in c.env.items() if k in daemons.agent_env(cfg)} == daemons.agent_env(cfg)


def test_the_images_entrypoint_is_what_the_sandbox_runs() -> None:
    """The container has no `command`: the image's ENTRYPOINT runs, which the sandbox
    replaces by the agent's own entry point (it takes the same `agent run ...`)."""
    dockerfile = (shipped.MANIFEST.parents[2] / "Dockerfile").read_text()
    (entry,) = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    assert json.loads(entry) == [shipped.IMAGE]
    c = shipped.agent_container(_pod_spec(shipped.load()))
    assert "command" not in c and c["image"].startswith(f"{shipped.IMAGE}:")


def _drifted(change: Any) -> dict[str, Any]:
    ds = copy.deepcopy(shipped.load())
    change(shipped.agent_container(_pod_spec(ds)), _pod_spec(ds))
    return ds


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda c, s: c["args"].append("--interval=5"), "--interval=5"),
        (lambda c, s: c["args"].__setitem__(c["args"].index("--metrics-port=9400"),
                                            "--metrics-port=9401"), "--metrics-port"),
        (lambda c, s: c["args"].remove("--k8s-condition"), "--k8s-condition"),
        (lambda c, s: c["env"].append({"name": "AUTOCLUSTERS_AGENT_INTERVAL_S", "value": "5"}),
         "AUTOCLUSTERS_AGENT_INTERVAL_S"),
        (lambda c, s: c["env"][0].__setitem__("valueFrom", {"fieldRef": {
            "fieldPath": "metadata.name"}}), "NODE_NAME"),
        (lambda c, s: c.__setitem__("command", ["/bin/sh"]), "command"),
        (lambda c, s: c.__setitem__("image", "nvcr.io/other:1"), "image"),
        (lambda c, s: s["volumes"].__setitem__(1, {"name": "spool", "hostPath": {
            "path": "/data/agent"}}), "/var/lib/autoclusters/agent"),
        (lambda c, s: (c["volumeMounts"].append({"name": "dev", "mountPath": "/dev"}),
                       s["volumes"].append({"name": "dev", "hostPath": {"path": "/dev"}})),
         "/dev"),
    ],
)  # fmt: skip
def test_a_drifted_manifest_is_refused_with_what_drifted(
    cfg: SandboxConfig, change: Any, named: str
) -> None:
    ds = _drifted(change)
    with pytest.raises(shipped.ManifestDrift, match=re.escape(named)):
        shipped.check(ds)
    with pytest.raises(shipped.ManifestDrift):
        shipped.render(cfg, _pod_spec(ds), NODE, _secret)


def test_a_missing_secret_keeps_the_container_from_starting(cfg: SandboxConfig) -> None:
    with pytest.raises(shipped.SandboxError, match="autoclusters-api-tokens"):
        shipped.render(cfg, _pod_spec(shipped.load()), NODE, lambda name, key: None)


def test_var_expansion_follows_kubernetes() -> None:
    env = {"A": "x"}
    assert shipped.expand("--a=$(A)", env) == "--a=x"
    assert shipped.expand("$(B)", env) == "$(B)"  # undefined: left as written
    assert shipped.expand("$$(A)", env) == "$(A)"  # escaped


# --- the emulator's DaemonSet controller ------------------------------------------------------


@pytest.fixture
def emu() -> Iterator[Running]:
    with running(TOKEN, tls=True) as e:
        yield e


def _node(emu: Running, name: str, *, gpu: bool = True, taint: bool = False) -> None:
    labels = {"nvidia.com/gpu.present": "true"} if gpu else {}
    taints = [{"key": "autoclusters.io/remediation", "value": "x", "effect": "NoExecute"}]
    httpx.post(
        f"{emu.url}/_emulator/nodes",
        json={"name": name, "provider_id": f"crusoe://{name}", "labels": labels,
              "register_taints": taints if taint else []},
        verify=emu.verify,
    ).raise_for_status()  # fmt: skip


def _daemon_pods(core: client.CoreV1Api) -> dict[str, Any]:
    pods = core.list_namespaced_pod(
        "autoclusters", label_selector=f"{shipped.APP_LABEL}={shipped.APP}"
    )
    return {p.spec.node_name: p for p in pods.items if p.metadata.deletion_timestamp is None}


def test_the_daemonset_controller_keeps_one_pod_per_gpu_node(emu: Running, tmp_path: Path) -> None:
    (tmp_path / "kubeconfig").write_text(emu.kubeconfig())
    api = api_client(kubeconfig=tmp_path / "kubeconfig")
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    _node(emu, "gpu-1")
    _node(emu, "gpu-2", taint=True)  # under remediation: the shipped tolerations keep it
    _node(emu, "system-1", gpu=False)  # no GPU: the node selector leaves it out
    core.create_namespace({"metadata": {"name": "autoclusters"}})
    apps.create_namespaced_daemon_set("autoclusters", shipped.load())

    pods = _daemon_pods(core)
    assert sorted(pods) == ["gpu-1", "gpu-2"]
    pod = pods["gpu-1"]
    assert pod.metadata.name.startswith("autoclusters-agent-")
    assert pod.metadata.owner_references[0].kind == "DaemonSet"
    assert pod.spec.containers[0].args == shipped.load()["spec"]["template"]["spec"][
        "containers"][0]["args"]  # fmt: skip
    # The emulator's own kubelet runs it here (no external kubelet in this test).
    assert pod.status.phase == "Running"
    ds = apps.read_namespaced_daemon_set("autoclusters-agent", "autoclusters")
    assert (ds.status.desired_number_scheduled, ds.status.current_number_scheduled) == (2, 2)
    assert ds.status.number_ready == 2

    # A deleted pod is replaced on its Node; a new Node gets one; a gone Node's goes.
    core.delete_namespaced_pod(pod.metadata.name, "autoclusters", grace_period_seconds=0)
    again = _daemon_pods(core)
    assert again["gpu-1"].metadata.uid != pod.metadata.uid
    _node(emu, "gpu-3")
    assert sorted(_daemon_pods(core)) == ["gpu-1", "gpu-2", "gpu-3"]
    httpx.delete(f"{emu.url}/_emulator/nodes/gpu-2", verify=emu.verify).raise_for_status()
    assert sorted(_daemon_pods(core)) == ["gpu-1", "gpu-3"]
    ds = apps.read_namespaced_daemon_set("autoclusters-agent", "autoclusters")
    assert ds.status.desired_number_scheduled == 2

    # Deleting the DaemonSet takes its pods (the garbage collector).
    apps.delete_namespaced_daemon_set("autoclusters-agent", "autoclusters")
    assert _daemon_pods(core) == {}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="Debian's kubectl is not installed")
def test_kubectl_lists_the_daemonset(emu: Running, tmp_path: Path) -> None:

    _node(emu, "gpu-1")
    admin = httpx.Client(
        base_url=emu.url, headers={"Authorization": f"Bearer {TOKEN}"}, verify=emu.verify
    )
    admin.post("/api/v1/namespaces", json={"metadata": {"name": "autoclusters"}})
    admin.post(
        "/apis/apps/v1/namespaces/autoclusters/daemonsets", json=shipped.load()
    ).raise_for_status()
    config = tmp_path / "kubeconfig"
    config.write_text(emu.kubeconfig())
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(config)}
    out = subprocess.run(
        ["kubectl", "get", "ds", "-n", "autoclusters"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    header, row = out.stdout.splitlines()
    assert header.split()[:6] == ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE"]
    # One GPU Node: one pod, Running (the emulator's own kubelet here), the shipped selector.
    assert row.split()[:7] == ["autoclusters-agent", "1", "1", "1", "1", "1",
                               "nvidia.com/gpu.present=true"]  # fmt: skip


# --- the kubelet's agent pods (sandbox/slinky/agent_pods.py), on the in-process emulator --------


@pytest.mark.integration
def test_the_kubelet_runs_each_agent_pod_as_its_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod's container is a process with the manifest's rendering; a crashed container
    runs again in the same pod, a deleted pod's process stops and the new pod's starts, a
    Node's going stops its agent. Real agent processes (they report to no API here), each
    with its /metrics server: in the integration lane, since `make unit` starts none."""
    from autoclusters.sandbox.machines import agent_targets
    from autoclusters.sandbox.runtime.processes import ProcessTable
    from autoclusters.sandbox.slinky import agent_pods
    from autoclusters.sandbox.slinky.operator_pods import HOSTNAME_OVERRIDE
    from tests.conftest import free_port_base

    cfg = SandboxConfig(state_dir=tmp_path / "sandbox", platform="cmk", port_base=free_port_base())
    for sub, text in (("api", "agent-token"), ("k8s", TOKEN)):
        (cfg.state_dir / sub).mkdir(parents=True)
        (cfg.state_dir / sub / "token").write_text(text)
    table = ProcessTable(cfg.state_dir)
    selector = f"{shipped.APP_LABEL}={shipped.APP}"
    with running(TOKEN, external_kubelet=selector, tls=True) as emu:
        monkeypatch.setattr(SandboxConfig, "k8s_url", property(lambda self: emu.url))
        cfg.k8s_ca.write_text(emu.ca_pem)
        admin = httpx.Client(base_url=emu.url, timeout=10, verify=emu.verify)
        admin.post(
            "/_emulator/nodes",
            json={"name": "cmk-gpu-1", "labels": {"nvidia.com/gpu.present": "true"},
                  "annotations": {HOSTNAME_OVERRIDE: "gpu-01"}},
        ).raise_for_status()  # fmt: skip
        shipped.install(cfg)
        (tmp_path / "kubeconfig").write_text(emu.kubeconfig())
        api = api_client(kubeconfig=tmp_path / "kubeconfig")
        core = client.CoreV1Api(api)
        kubelet = agent_pods.AgentPods(core, cfg)

        def sync() -> dict[str, Any]:
            every = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)
            nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
            kubelet.sync(every["items"], {n["metadata"]["name"]: n for n in nodes}, [])
            pods = json.loads(core.list_namespaced_pod("autoclusters", _preload_content=False).data)
            return {p["metadata"]["uid"]: p for p in pods["items"]}

        try:
            (pod,) = sync().values()
            assert pod["status"]["phase"] == "Running"
            pid = shipped.pid_of(pod)
            rec = table.get("agent-gpu-01")
            assert rec is not None and rec.pid == pid and table.alive("agent-gpu-01")
            want = shipped.render(cfg, pod["spec"], NODE, _secret)
            assert command_line(pid) == want.argv
            assert agent_targets.nodes(cfg) == ["gpu-01"]
            assert sync()[pod["metadata"]["uid"]]["status"] == pod["status"]  # a quiet pass

            table.kill("agent-gpu-01")  # the container crashes: the same pod runs it again
            again = sync()[pod["metadata"]["uid"]]
            assert shipped.pid_of(again) not in (None, pid) and shipped.restarts_of(again) == 1
            crashed_pid = shipped.pid_of(again)

            core.delete_namespaced_pod(pod["metadata"]["name"], "autoclusters")
            sync()  # the deleted pod's process stops, its deletion completes
            assert crashed_pid is not None and not Path(f"/proc/{crashed_pid}").exists()
            (new,) = sync().values()  # the DaemonSet's new pod runs a new process
            assert new["metadata"]["uid"] != pod["metadata"]["uid"]
            assert shipped.pid_of(new) == table.get("agent-gpu-01").pid  # type: ignore[union-attr]
            assert shipped.restarts_of(new) == 0

            admin.delete("/_emulator/nodes/cmk-gpu-1").raise_for_status()
            assert sync() == {}  # the Node's pod went with it, and its process
            assert not table.alive("agent-gpu-01") and agent_targets.nodes(cfg) == []
        finally:
            for r in table.records():
                table.stop(r.name)
